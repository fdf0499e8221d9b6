package jobs_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestBackoffDecidesTheRetryDelays: a failing run is retried MaxRetries
// times, each no earlier than the job's Backoff for the attempt that
// failed (1, 2, 3) after it: growing delays grow the gaps between the
// attempts. asynq keeps a retry's due time in whole seconds, cut off, so a
// Backoff of 600 ms retried after 100 ms (the retry check) and every
// retry came up to a second early. DefaultBackoff doubles from 1 s within
// ±20%, capped at 10 minutes.
func TestBackoffDecidesTheRetryDelays(t *testing.T) {
	t.Parallel()
	for attempt, base := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second,
		10: 512 * time.Second, 11: 10 * time.Minute, 40: 10 * time.Minute} {
		for range 50 {
			d := jobs.DefaultBackoff(attempt)
			require.GreaterOrEqual(t, d, base*8/10, "attempt %d", attempt)
			require.LessOrEqual(t, d, base*12/10, "attempt %d", attempt)
		}
	}

	var mu sync.Mutex
	var starts []time.Time
	var asked []int
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "flaky", &jobs.Options{MaxRetries: 3, Backoff: func(attempt int) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, attempt)
			return time.Duration(attempt) * 600 * time.Millisecond
		}}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			mu.Lock()
			defer mu.Unlock()
			starts = append(starts, time.Now())
			return fmt.Errorf("attempt %d fails", jc.Retry+1)
		})
	})
	r := b.runner(t, nil)
	_, err := r.Client().Dispatch(context.Background(), "test:job:flaky", exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	eventually(t, "the archived run", func() bool {
		a, err := r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		return len(a) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, 4, "one run and three retries")
	require.Equal(t, []int{1, 2, 3}, asked)
	for i := 1; i < len(starts); i++ {
		gap := starts[i].Sub(starts[i-1])
		want := time.Duration(i) * 600 * time.Millisecond
		require.GreaterOrEqual(t, gap, want-50*time.Millisecond, "gap before retry %d", i)
		require.Less(t, gap, want+1500*time.Millisecond, "gap before retry %d", i)
	}
}
