package jobs_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// crashUniqueEnv makes TestCrashWorkerProcess declare test:job:stuck with
// a Unique window (see registerStuckUnique).
const crashUniqueEnv = "KUMIKO_JOBS_CRASH_UNIQUE"

// registerStuckUnique declares test:job:stuck like registerStuck, with a
// Unique window of an hour.
func registerStuckUnique(f *framework.Feature, run func(ctx context.Context, jc *jobs.Context, in exportInput) error) {
	jobs.Manual[exportInput](f, "stuck", &jobs.Options{MaxRetries: -1, Unique: time.Hour}, run)
}

// TestRunArchivedAfterItsWorkersDiedHoldsNoWindow: a run of a Unique job
// that kills its worker in every attempt (out of memory, say) is archived
// by asynq once its lease runs out on the attempt kept for a dead worker,
// and no handler of it returns to free its uniqueness lock. The README
// says an archived run holds no window: an equal dispatch runs, and an
// operator's retry of the archived run is not refused as a duplicate of
// itself.
func TestRunArchivedAfterItsWorkersDiedHoldsNoWindow(t *testing.T) {
	t.Parallel()
	ran := make(chan string, 4)
	b := setup(t, func(b *bundle) {
		registerStuckUnique(b.f, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			ran <- in.Report
			return insertRun(ctx, jc, jc.Job, in.Report, "survivor")
		})
	})
	client, err := jobs.New(b.rt, b.rdb, nil)
	require.NoError(t, err)
	bin, err := os.Executable()
	require.NoError(t, err)
	kills := 0
	// archiveByDeadWorkers dispatches a run of report and has two worker
	// processes die in it: in its only allowed attempt, and in the one
	// kept for a dead worker; the recoverer of the next runner to start
	// archives it.
	archiveByDeadWorkers := func(report string) string {
		id, err := client.Client().Dispatch(t.Context(), "test:job:stuck", exportInput{Report: report}, &jobs.DispatchOptions{TenantID: "acme"})
		require.NoError(t, err)
		for range 2 {
			kills++
			worker := proctest.Start(t, bin, "worker", map[string]string{
				crashDBEnv: b.db.URL, crashRedisEnv: b.redis.URL, crashUniqueEnv: "1",
			}, "-test.run=^TestCrashWorkerProcess$", "-test.count=1")
			eventually(t, "a worker process to start the run", func() bool {
				return b.count(t, `SELECT count(*) FROM runs WHERE info = 'killed worker'`) == kills
			})
			worker.Kill()
			require.Positive(t, b.redis.ExpireLeases(t), "the killed worker's run holds a lease")
		}
		return id
	}
	archived := func(in *jobs.Inspector, id string) {
		t.Helper()
		eventually(t, "the run to be archived", func() bool {
			run, err := in.Get(t.Context(), "", id)
			require.NoError(t, err)
			return run.State == jobs.StateArchived
		})
	}
	wantRun := func(want string) {
		t.Helper()
		select {
		case report := <-ran:
			require.Equal(t, want, report)
		case <-time.After(30 * time.Second):
			t.Fatalf("run %s did not run", want)
		}
	}

	// run starts a runner of this process, whose recoverer archives a
	// run whose attempts are used up; stop stops it.
	run := func() (r *jobs.Runner, stop func()) {
		r, err := jobs.New(b.rt, b.rdb, &jobs.Config{Lanes: jobs.Lanes, RetryCheckInterval: 100 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		stop = sync.OnceFunc(func() { cancel(); require.NoError(t, <-done) })
		t.Cleanup(stop)
		return r, stop
	}

	id := archiveByDeadWorkers("r1")
	r, stop := run()
	archived(r.Inspector(), id)
	_, err = r.Inspector().Retry(t.Context(), "", id)
	require.NoError(t, err, "the archived run is refused as a duplicate of itself")
	wantRun("r1")
	drained(t, r.Inspector())
	stop()

	id = archiveByDeadWorkers("r2")
	r, _ = run()
	archived(r.Inspector(), id)
	_, err = r.Client().Dispatch(t.Context(), "test:job:stuck", exportInput{Report: "r2"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err, "the archived run neither waits nor runs, yet holds the window")
	wantRun("r2")
	drained(t, r.Inspector())
}
