package idempotency_test

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// TestCloseRacingFinishAsync hammers Begin and FinishAsync from many
// goroutines while Close is called (twice, concurrently): nothing may race,
// panic (a WaitGroup reused after Wait) or hang, every done runs exactly
// once and without error, and every key replays its stored response.
func TestCloseRacingFinishAsync(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	var started, finished atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	keys := make(chan string, 100000)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := "race-" + strconv.Itoa(w) + "-" + strconv.Itoa(i)
				claim, _, err := s.Begin(ctx, scope(key), "fp")
				if err != nil {
					t.Error(err)
					return
				}
				started.Add(1)
				var once atomic.Bool
				claim.FinishAsync(response(key), func(err error) {
					if !once.CompareAndSwap(false, true) {
						t.Error("done called twice")
					}
					if err != nil {
						t.Error(err)
					}
					finished.Add(1)
				})
				keys <- key
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	var closers sync.WaitGroup
	for range 2 {
		closers.Go(func() { require.NoError(t, s.Close(ctx)) })
	}
	closers.Wait()
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	require.Equal(t, started.Load(), finished.Load(), "every finish ran by the time its caller and Close returned")
	close(keys)
	n := 0
	for key := range keys {
		if n++; n%50 != 0 {
			continue
		}
		claim, replay, err := s.Begin(ctx, scope(key), "fp")
		require.NoError(t, err)
		require.Nil(t, claim)
		require.Equal(t, key, string(replay.Body))
	}
	require.Positive(t, n)
}
