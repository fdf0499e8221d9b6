package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestRetriesThenArchiveThenCLIRetry: a failing job is retried MaxRetries
// times, then archived; `kumiko jobs list --state archived` shows it and
// `kumiko jobs retry ID` runs it again, now successfully.
func TestRetriesThenArchiveThenCLIRetry(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	var attempts atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "flaky", &jobs.Options{
			MaxRetries: 2,
			Backoff:    func(int) time.Duration { return 10 * time.Millisecond },
		}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			attempts.Add(1)
			if !healthy.Load() {
				return fmt.Errorf("upstream down (attempt %d)", jc.Retry+1)
			}
			return insertRun(ctx, jc, jc.Job, in.Report, "")
		})
	})
	r := b.runner(t, nil)
	id, err := r.Client().Dispatch(context.Background(), "test:job:flaky", exportInput{Report: "r1"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)

	in := r.Inspector()
	var archived []jobs.TaskInfo
	eventually(t, "the run to be archived", func() bool {
		archived, err = in.List(context.Background(), nil)
		require.NoError(t, err)
		return len(archived) == 1
	})
	require.Equal(t, int64(3), attempts.Load(), "one run and two retries")
	a := archived[0]
	require.Equal(t, id, a.ID)
	require.Equal(t, "test:job:flaky", a.Job)
	require.Equal(t, framework.RunInWorker, a.Lane)
	require.Equal(t, jobs.StateArchived, a.State)
	require.Equal(t, "acme", a.TenantID)
	require.Equal(t, 2, a.Retried)
	require.Equal(t, 2, a.MaxRetry)
	require.Contains(t, a.LastError, "upstream down (attempt 3)")
	require.JSONEq(t, `{"report":"r1"}`, string(a.Input))
	require.Equal(t, float64(3), metric(t, b, "kumiko_jobs_failed_total", "job", "test:job:flaky"))
	require.Equal(t, float64(2), metric(t, b, "kumiko_jobs_retried_total", "job", "test:job:flaky"))
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_archived_total", "job", "test:job:flaky"))

	env := []string{"REDIS_URL=" + b.redis.URL, "DATABASE_URL=" + b.db.URL}
	out := kumiko(t, env, "jobs", "list", "--state", "archived")
	require.Contains(t, out, id)
	require.Contains(t, out, "upstream down (attempt 3)")
	var listed []jobs.TaskInfo
	require.NoError(t, json.Unmarshal([]byte(kumiko(t, env, "jobs", "list", "--lane", "worker", "--json")), &listed))
	require.Len(t, listed, 1)
	require.Equal(t, id, listed[0].ID)
	require.Contains(t, kumiko(t, env, "jobs", "list", "--lane", "api"), "no archived job runs")

	healthy.Store(true)
	require.Contains(t, kumiko(t, env, "jobs", "retry", id), "retrying "+id)
	eventually(t, "the retried run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 1 })
	drained(t, in)
	archived, err = in.List(context.Background(), nil)
	require.NoError(t, err)
	require.Empty(t, archived)
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_succeeded_total", "job", "test:job:flaky"))

	// Retrying what is not archived, or does not exist, is refused.
	_, err = in.Retry(context.Background(), "", "nope")
	require.ErrorIs(t, err, jobs.ErrTaskNotFound)
	_, err = in.List(context.Background(), &jobs.ListOptions{State: "lost"})
	require.ErrorContains(t, err, `unknown state "lost"`)
}

// TestSkipRetryArchivesAtOnce: a handler error wrapping SkipRetry (and a
// panic's, after its retries) archives the run.
func TestSkipRetryArchivesAtOnce(t *testing.T) {
	t.Parallel()
	var attempts atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "hopeless", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			attempts.Add(1)
			return fmt.Errorf("report %s cannot exist: %w", in.Report, jobs.SkipRetry)
		})
		jobs.Manual[exportInput](b.f, "panics", &jobs.Options{MaxRetries: -1}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			panic(errors.New("boom"))
		})
	})
	r := b.runner(t, nil)
	for _, job := range []string{"test:job:hopeless", "test:job:panics"} {
		_, err := r.Client().Dispatch(context.Background(), job, exportInput{Report: "x"}, nil)
		require.NoError(t, err)
	}
	eventually(t, "two archived runs", func() bool {
		l, err := r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		return len(l) == 2
	})
	require.Equal(t, int64(1), attempts.Load())
	require.Equal(t, float64(2), metric(t, b, "kumiko_jobs_archived_total"))
}
