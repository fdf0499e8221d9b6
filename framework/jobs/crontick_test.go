package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestEveryTickTimeIsTheTick: "@every" takes any duration of at least a
// second, and its ticks fall on multiples of it since the Unix epoch; a
// run's Tick.Time is the tick it belongs to, also when that is not a
// whole second (every other tick of "@every 1500ms").
func TestEveryTickTimeIsTheTick(t *testing.T) {
	t.Parallel()
	ticks := make(chan time.Time, 16)
	b := setup(t, func(b *bundle) {
		jobs.Cron(b.f, "every-one-and-a-half", "@every 1500ms", nil, func(ctx context.Context, jc *jobs.Context, tick jobs.Tick) error {
			ticks <- tick.Time
			return nil
		})
	})
	b.runner(t, &jobs.Config{Lanes: jobs.Lanes, Scheduler: true})
	for range 2 { // two ticks in a row: one of them is not a whole second
		select {
		case at := <-ticks:
			require.Zero(t, at.UnixNano()%int64(1500*time.Millisecond), "tick %s is no multiple of 1.5 s", at.Format(time.RFC3339Nano))
		case <-time.After(10 * time.Second):
			t.Fatal("no tick")
		}
	}
}
