package jobs_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestRaisedMaxRetriesArchivesOldRunsVisibly: a release that raised a
// job's MaxRetries finds runs the earlier build enqueued, which carry the
// earlier limit (asynq archives a run by the limit it was enqueued with).
// The runner judged the last attempt by the job's new limit: such a run's
// last allowed attempt failed as one to be retried, asynq then spent the
// attempt kept for a dead worker on it and archived it after that one,
// and the archiving was counted and logged as a retry, so
// kumiko_jobs_archived_total (the metric to alert on) never saw it.
func TestRaisedMaxRetriesArchivesOldRunsVisibly(t *testing.T) {
	t.Parallel()
	fast := func(int) time.Duration { return 0 }
	var attempts atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "flaky", &jobs.Options{MaxRetries: 5, Backoff: fast},
			func(ctx context.Context, jc *jobs.Context, in exportInput) error {
				attempts.Add(1)
				return errors.New("still failing")
			})
	})
	// The earlier build: the same job with MaxRetries 1 enqueues the run.
	old := framework.NewRegistry()
	jobs.Manual[exportInput](old.Feature("test"), "flaky", &jobs.Options{MaxRetries: 1, Backoff: fast},
		func(context.Context, *jobs.Context, exportInput) error { return nil })
	oldRT, err := framework.NewRuntime(old, b.db.Pool, nil)
	require.NoError(t, err)
	enqueuer, err := jobs.New(oldRT, b.rdb, &jobs.Config{Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	_, err = enqueuer.Client().Dispatch(context.Background(), "test:job:flaky", exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)

	r := b.runner(t, nil)
	eventually(t, "the run archived", func() bool {
		a, err := r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		return len(a) == 1
	})
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, int64(2), attempts.Load(), "the run carries MaxRetries 1: it runs twice, the attempt for a dead worker unspent")
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_archived_total", "job", "test:job:flaky"))
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_retried_total", "job", "test:job:flaky"))
}
