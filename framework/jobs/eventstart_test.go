package jobs_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestEventToStartSampledOnceAcrossAShutdown: a run still going when a
// worker's ShutdownTimeout passes is put back on its queue unchanged (its
// retry count stays 0) and runs again on the next worker. That restart is
// no new delivery of the event: kumiko_jobs_event_to_start_seconds keeps
// the one sample its first start took.
func TestEventToStartSampledOnceAcrossAShutdown(t *testing.T) {
	t.Parallel()
	var attempts atomic.Int64
	started := make(chan struct{}, 1)
	b := setup(t, func(b *bundle) {
		jobs.OnEvent(b.f, "slow", b.noted, nil, func(ctx context.Context, jc *jobs.Context, e framework.Event[noted]) error {
			if attempts.Add(1) == 1 {
				started <- struct{}{}
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		})
	})
	log := &logged{}
	first, err := jobs.New(b.rt, b.rdb, &jobs.Config{
		Lanes: jobs.Lanes, ShutdownTimeout: 200 * time.Millisecond, Metrics: b.prom, Logger: slog.New(log),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	b.dispatch(t, first.Consumer())
	b.write(t, "acme", 0, 1)
	<-started
	cancel()
	require.NoError(t, <-done)
	eventually(t, "the interrupted run's handler returned", func() bool { return log.has("job interrupted by shutdown") })
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_event_to_start_seconds", "job", "test:job:slow"))

	b.runner(t, nil)
	eventually(t, "the requeued run to succeed", func() bool {
		return metric(t, b, "kumiko_jobs_succeeded_total", "job", "test:job:slow") == 1
	})
	require.Equal(t, int64(2), attempts.Load())
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_event_to_start_seconds", "job", "test:job:slow"),
		"one sample for the one run, not one per start")
}
