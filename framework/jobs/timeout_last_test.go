package jobs_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestTimedOutLastAttemptIsArchived: a run that times out on its last
// allowed attempt is archived, not run again. The job's Timeout here is a
// whole number of seconds, so asynq's deadline for the run ended at the
// same instant as the run's own context; asynq saw its deadline before the
// handler's error (which the runner marks to archive) and retried the run
// on the attempt kept for a dead worker: a job with MaxRetries -1 ran twice.
// A handler that ignores its context is abandoned before asynq's deadline
// and archived too (it too ran twice, the second run beside the first).
func TestTimedOutLastAttemptIsArchived(t *testing.T) {
	t.Parallel()
	var attempts atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "slow", &jobs.Options{Timeout: time.Second, MaxRetries: -1,
			Backoff: func(int) time.Duration { return 10 * time.Millisecond }},
			func(ctx context.Context, jc *jobs.Context, in exportInput) error {
				attempts.Add(1)
				<-ctx.Done()
				return ctx.Err()
			})
		jobs.Manual[exportInput](b.f, "deaf", &jobs.Options{Timeout: time.Second, MaxRetries: -1},
			func(ctx context.Context, jc *jobs.Context, in exportInput) error {
				attempts.Add(1)
				time.Sleep(4 * time.Second)
				return nil
			})
	})
	r := b.runner(t, nil)
	for _, job := range []string{"slow", "slow", "slow", "deaf"} {
		_, err := r.Client().Dispatch(context.Background(), "test:job:"+job, exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
		require.NoError(t, err)
	}
	eventually(t, "four archived runs", func() bool {
		a, err := r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		return len(a) == 4
	})
	time.Sleep(4 * time.Second)
	require.Equal(t, int64(4), attempts.Load(), "a job with MaxRetries -1 runs once, also when it times out")
	require.Equal(t, float64(3), metric(t, b, "kumiko_jobs_archived_total", "job", "test:job:slow"))
	require.Equal(t, float64(3), metric(t, b, "kumiko_jobs_failed_total", "job", "test:job:slow"))
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_archived_total", "job", "test:job:deaf"))
	require.Equal(t, float64(0), metric(t, b, "kumiko_jobs_retried_total"))
}

// TestAbandonedRunIsLoggedWithItsTenant: the log lines of a run abandoned
// after its Timeout (its handler ignores its context) carry the run's
// tenant like those of every other run. The runner logs such a run from a
// copy of the run's Context taken before the handler started, and the
// tenant is only known once the task's payload is decoded: the copy had
// none, so the "job archived" line of exactly the runs an operator has to
// chase named no tenant.
func TestAbandonedRunIsLoggedWithItsTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "deaf", &jobs.Options{Timeout: 200 * time.Millisecond, MaxRetries: -1},
			func(ctx context.Context, jc *jobs.Context, in exportInput) error {
				time.Sleep(3 * time.Second)
				return nil
			})
	})
	log := &lines{}
	r := b.runner(t, &jobs.Config{Lanes: jobs.Lanes, Logger: slog.New(slog.NewJSONHandler(log, nil))})
	_, err := r.Client().Dispatch(context.Background(), "test:job:deaf", exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	eventually(t, "the abandoned run archived", func() bool { return len(log.with("job archived")) == 1 })
	for _, msg := range []string{"job still running past its timeout; abandoned", "job archived"} {
		got := log.with(msg)
		require.Len(t, got, 1, msg)
		require.Equal(t, "acme", got[0]["tenant_id"], msg)
	}
	time.Sleep(3 * time.Second) // the abandoned handler returns before the leak check
}

// lines collects JSON log lines.
type lines struct {
	mu  sync.Mutex
	buf []byte
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	return len(p), nil
}

// with returns the lines whose msg is msg.
func (l *lines) with(msg string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(l.buf, []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(line, &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}
