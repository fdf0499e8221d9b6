// Package jobstest gives tests of jobs a private Redis server that they can
// stop and start again, to exercise outages without touching the shared
// Redis other tests use.
package jobstest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/internal/redistest"
)

// Redis is a redis-server process owned by one test (no persistence).
type Redis struct {
	// URL is redis://127.0.0.1:<port>/0; the port stays the same across
	// Stop and Start.
	URL string

	srv *redistest.Server
}

// StartRedis starts redis-server (from PATH) on a free port and stops it
// when the test ends.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	srv := redistest.Start(t)
	return &Redis{URL: "redis://" + srv.Addr() + "/0", srv: srv}
}

// Start starts the server (again) on its port and waits until it answers.
func (r *Redis) Start() { r.srv.Start() }

// Stop kills the server with SIGKILL (an outage: nothing is saved) and
// waits until it is gone.
func (r *Redis) Stop() { r.srv.Stop() }

// Client returns a client of the server, closed when the test ends.
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(r.URL)
	if err != nil {
		t.Fatalf("jobstest: %v", err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ExpireLeases does what a minute without a killed worker's heartbeats
// does: the leases of the runs it held run out, so the next worker to start
// (asynq recovers lease-expired runs then, and every minute) runs them
// again. It returns how many runs' leases it moved into the past.
func (r *Redis) ExpireLeases(t testing.TB) int {
	t.Helper()
	c := r.Client(t)
	ctx := context.Background()
	keys, err := c.Keys(ctx, "asynq:{*}:lease").Result()
	if err != nil {
		t.Fatalf("jobstest: lease keys: %v", err)
	}
	n := 0
	for _, k := range keys {
		ids, err := c.ZRange(ctx, k, 0, -1).Result()
		if err != nil {
			t.Fatalf("jobstest: leases of %s: %v", k, err)
		}
		for _, id := range ids {
			if err := c.ZAdd(ctx, k, redis.Z{Score: float64(time.Now().Add(-2 * time.Minute).Unix()), Member: id}).Err(); err != nil {
				t.Fatalf("jobstest: expire lease of %s: %v", id, err)
			}
			n++
		}
	}
	return n
}
