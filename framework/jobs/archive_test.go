package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
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

// TestListShowsTheNewestArchivedRunsFirst: with more archived runs than the
// limit, List returns the newest ones across every queue (asynq lists an
// archive oldest first, and a queue's newest may sit on the page before
// its last), newest first; a tenant filter finds the oldest run too.
func TestListShowsTheNewestArchivedRunsFirst(t *testing.T) {
	t.Parallel()
	fail := func(ctx context.Context, jc *jobs.Context, in noteInput) error {
		return fmt.Errorf("run %s fails: %w", in.Note, jobs.SkipRetry)
	}
	b := setup(t, func(b *bundle) {
		jobs.Manual[noteInput](b.f, "fail", nil, fail)
		jobs.Manual[noteInput](b.f, "fail-high", &jobs.Options{Priority: jobs.PriorityHigh}, fail)
	})
	r := b.runner(t, &jobs.Config{Lanes: jobs.Lanes, Concurrency: 20})
	in := r.Inspector()
	ctx := context.Background()
	dispatch := func(job, tenant, note string) string {
		id, err := r.Client().Dispatch(ctx, job, noteInput{Note: note}, &jobs.DispatchOptions{TenantID: tenant})
		require.NoError(t, err)
		return id
	}
	archived := func(n int) {
		eventually(t, fmt.Sprint(n, " archived runs"), func() bool {
			l, err := in.List(ctx, &jobs.ListOptions{Limit: 1000})
			require.NoError(t, err)
			return len(l) == n
		})
	}

	// The old runs: 99 in the default queue (the first of another tenant),
	// 3 in the high one.
	globex := dispatch("test:job:fail", "globex", "old-globex")
	for i := range 98 {
		dispatch("test:job:fail", "acme", fmt.Sprint("old-", i))
	}
	for i := range 3 {
		dispatch("test:job:fail-high", "acme", fmt.Sprint("old-high-", i))
	}
	archived(102)
	// Archive times are in seconds: the new runs fail in a later one.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
	newest := []string{
		dispatch("test:job:fail-high", "acme", "new-high"),
		dispatch("test:job:fail", "acme", "new-0"),
		dispatch("test:job:fail", "acme", "new-1"),
	}
	archived(105)

	l, err := in.List(ctx, &jobs.ListOptions{Limit: 3})
	require.NoError(t, err)
	ids := make([]string, len(l))
	for k, ti := range l {
		ids[k] = ti.ID
	}
	require.ElementsMatch(t, newest, ids)
	all, err := in.List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, all, 50, "the default limit")
	require.ElementsMatch(t, newest, []string{all[0].ID, all[1].ID, all[2].ID})
	require.True(t, all[2].LastFailedAt.After(all[3].LastFailedAt), "the new runs failed after the old ones")
	for k := 1; k < len(all); k++ {
		require.False(t, all[k].LastFailedAt.After(all[k-1].LastFailedAt), "newest first: %v", all)
	}

	l, err = in.List(ctx, &jobs.ListOptions{TenantID: "globex", Limit: 5})
	require.NoError(t, err)
	require.Len(t, l, 1)
	require.Equal(t, globex, l[0].ID)
}

// TestListShowsRetryRunsSoonestDueFirst: runs waiting for a retry are
// listed by when they are due, across priority queues.
func TestListShowsRetryRunsSoonestDueFirst(t *testing.T) {
	t.Parallel()
	fail := func(ctx context.Context, jc *jobs.Context, in noteInput) error {
		return fmt.Errorf("run %s fails", in.Note)
	}
	b := setup(t, func(b *bundle) {
		jobs.Manual[noteInput](b.f, "later", &jobs.Options{Priority: jobs.PriorityHigh, Backoff: func(int) time.Duration { return 2 * time.Hour }}, fail)
		jobs.Manual[noteInput](b.f, "sooner", &jobs.Options{Priority: jobs.PriorityLow, Backoff: func(int) time.Duration { return time.Hour }}, fail)
	})
	r := b.runner(t, nil)
	in := r.Inspector()
	ctx := context.Background()
	later, err := r.Client().Dispatch(ctx, "test:job:later", noteInput{Note: "later"}, nil)
	require.NoError(t, err)
	sooner, err := r.Client().Dispatch(ctx, "test:job:sooner", noteInput{Note: "sooner"}, nil)
	require.NoError(t, err)
	eventually(t, "two runs waiting for a retry", func() bool {
		l, err := in.List(ctx, &jobs.ListOptions{State: jobs.StateRetry})
		require.NoError(t, err)
		return len(l) == 2
	})
	l, err := in.List(ctx, &jobs.ListOptions{State: jobs.StateRetry, Limit: 1})
	require.NoError(t, err)
	require.Len(t, l, 1)
	require.Equal(t, sooner, l[0].ID)
	l, err = in.List(ctx, &jobs.ListOptions{State: jobs.StateRetry})
	require.NoError(t, err)
	require.Equal(t, []string{sooner, later}, []string{l[0].ID, l[1].ID})
}

// TestArchivedUniqueRunBlocksNoEqualDispatch: a Unique job's run that is
// archived is neither waiting nor running, so an equal dispatch after it
// runs instead of being a duplicate for the rest of the window; a run that
// failed and waits for its retry still refuses one.
func TestArchivedUniqueRunBlocksNoEqualDispatch(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	b := setup(t, func(b *bundle) {
		fragile := func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			if !healthy.Load() {
				return fmt.Errorf("report %s failed", in.Report)
			}
			return insertRun(ctx, jc, jc.Job, in.Report, jc.TaskID)
		}
		jobs.Manual[exportInput](b.f, "fragile", &jobs.Options{Unique: time.Hour, MaxRetries: -1}, fragile)
		jobs.Manual[exportInput](b.f, "patient", &jobs.Options{Unique: time.Hour, MaxRetries: 1,
			Backoff: func(int) time.Duration { return time.Hour }}, fragile)
	})
	r := b.runner(t, nil)
	ctx := context.Background()
	for _, job := range []string{"test:job:fragile", "test:job:patient"} {
		_, err := r.Client().Dispatch(ctx, job, exportInput{Report: "r1"}, &jobs.DispatchOptions{TenantID: "acme"})
		require.NoError(t, err)
	}
	eventually(t, "the archived run and the one waiting for its retry", func() bool {
		a, err := r.Inspector().List(ctx, &jobs.ListOptions{State: jobs.StateArchived})
		require.NoError(t, err)
		w, err := r.Inspector().List(ctx, &jobs.ListOptions{State: jobs.StateRetry})
		require.NoError(t, err)
		return len(a) == 1 && len(w) == 1
	})
	healthy.Store(true)
	_, err := r.Client().Dispatch(ctx, "test:job:patient", exportInput{Report: "r1"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.ErrorIs(t, err, jobs.ErrDuplicate, "the run waiting for its retry is an equal run")
	_, err = r.Client().Dispatch(ctx, "test:job:fragile", exportInput{Report: "r1"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err, "the archived run neither waits nor runs")
	eventually(t, "the second run", func() bool {
		return b.count(t, `SELECT count(*) FROM runs WHERE job = 'test:job:fragile' AND ref = 'r1'`) == 1
	})
}

// logged records the messages of a logger's records.
type logged struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logged) Enabled(context.Context, slog.Level) bool { return true }
func (l *logged) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *logged) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logged) WithGroup(string) slog.Handler      { return l }

func (l *logged) has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.msgs, msg)
}

// TestShutdownInterruptedUniqueRunKeepsItsLock: a run still going when the
// runner's ShutdownTimeout passes is put back on its queue by asynq, and
// then its context ends. It was neither archived nor failed: a Unique
// job's run on its last attempt (here its only one) keeps its uniqueness
// lock, so an equal dispatch while it waits to run again is a duplicate,
// and it is not counted or logged as archived.
func TestShutdownInterruptedUniqueRunKeepsItsLock(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 1)
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "long", &jobs.Options{Unique: time.Hour, MaxRetries: -1}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		})
	})
	log := &logged{}
	r, err := jobs.New(b.rt, b.rdb, &jobs.Config{
		Lanes: jobs.Lanes, ShutdownTimeout: 200 * time.Millisecond, Metrics: b.prom, Logger: slog.New(log),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	in := exportInput{Report: "r"}
	id, err := r.Client().Dispatch(context.Background(), "test:job:long", in, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	<-started
	cancel()
	require.NoError(t, <-done)
	eventually(t, "the interrupted run's handler returned", func() bool {
		return log.has("job interrupted by shutdown") || log.has("job archived")
	})

	run, err := r.Inspector().Get(context.Background(), "", id)
	require.NoError(t, err)
	require.Equal(t, jobs.StatePending, run.State, "asynq put the run back on its queue")
	require.False(t, log.has("job archived"))
	require.Zero(t, metric(t, b, "kumiko_jobs_archived_total", "job", "test:job:long"))
	_, err = r.Client().Dispatch(context.Background(), "test:job:long", in, &jobs.DispatchOptions{TenantID: "acme"})
	require.ErrorIs(t, err, jobs.ErrDuplicate, "the requeued run still holds the Unique window")
}
