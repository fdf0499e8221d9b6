package config

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/internal/redistest"
)

// TestRedisRestartIsRiddenOver: a client built from RedisOptions rides over
// a Redis restart of 150 ms, and above all answers every command once
// Redis answers again. With one dial per attempt each command that met
// the restart failed its dials at once, go-redis's pool counted them, and
// at PoolSize failed dials it refused every dial until its probe (once a
// second) got through: a 150 ms restart failed commands for most of a
// second after Redis was back.
func TestRedisRestartIsRiddenOver(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c, err := FromLookup(env(minimal(map[string]string{"REDIS_URL": "redis://" + srv.Addr() + "/0"})))
	require.NoError(t, err)
	opts, err := c.RedisOptions()
	require.NoError(t, err)
	rdb := redis.NewClient(opts)
	defer rdb.Close()

	var back atomic.Int64 // when Redis answered again (unix ns)
	var failedAfter atomic.Int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				err := rdb.Ping(ctx).Err()
				cancel()
				if b := back.Load(); err != nil && b != 0 && time.Now().UnixNano() > b {
					failedAfter.Add(1)
					lastErr.Store(err)
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	srv.Stop()
	time.Sleep(150 * time.Millisecond)
	srv.Start() // returns once Redis answers a PING
	back.Store(time.Now().UnixNano())
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	require.Zero(t, failedAfter.Load(), "commands failed after Redis was back (last: %v)", lastErr.Load())
}
