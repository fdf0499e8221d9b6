package jobs_test

import (
	"context"
	"maps"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// Environment of the worker process TestKilledWorkersRunRunsAgain starts
// (this test binary, running TestCrashWorkerProcess).
const (
	crashDBEnv    = "KUMIKO_JOBS_CRASH_DB"
	crashRedisEnv = "KUMIKO_JOBS_CRASH_REDIS"
)

// registerStuck declares test:job:stuck, which allows no retry: run is its
// handler.
func registerStuck(f *framework.Feature, run func(ctx context.Context, jc *jobs.Context, in exportInput) error) {
	jobs.Manual[exportInput](f, "stuck", &jobs.Options{MaxRetries: -1}, run)
}

// TestCrashWorkerProcess is the worker process of
// killWorkerInRun dispatches a run of test:job:stuck, declared by
// register, to a worker process (TestCrashWorkerProcess, with env besides
// the database and Redis) and kills it (SIGKILL) in the run; then it does
// what a minute without the dead worker's heartbeats does: its leases run
// out (asynq recovers such a run when a worker starts, and every minute).
// The test's own runner reports the runs it makes on the channel.
func killWorkerInRun(t *testing.T, register func(*framework.Feature, func(context.Context, *jobs.Context, exportInput) error), env map[string]string) (*bundle, chan string) {
	t.Helper()
	ran := make(chan string, 4)
	b := setup(t, func(b *bundle) {
		register(b.f, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			ran <- in.Report
			return insertRun(ctx, jc, jc.Job, in.Report, "second worker")
		})
	})
	client, err := jobs.New(b.rt, b.rdb, &jobs.Config{Lanes: jobs.Lanes})
	require.NoError(t, err)
	_, err = client.Client().Dispatch(t.Context(), "test:job:stuck", exportInput{Report: "r1"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)

	bin, err := os.Executable()
	require.NoError(t, err)
	procEnv := map[string]string{crashDBEnv: b.db.URL, crashRedisEnv: b.redis.URL}
	maps.Copy(procEnv, env)
	worker := proctest.Start(t, bin, "worker", procEnv, "-test.run=^TestCrashWorkerProcess$", "-test.count=1")
	eventually(t, "the worker process to start the run", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM runs WHERE info = 'killed worker'`).Scan(&n))
		return n == 1
	})
	worker.Kill()
	require.Positive(t, b.redis.ExpireLeases(t), "the killed worker's run holds a lease")
	return b, ran
}

// TestKilledWorkersRunRunsAgain: a runner whose test:job:stuck records its
// start and then hangs until the process is killed.
func TestCrashWorkerProcess(t *testing.T) {
	dbURL, redisURL := os.Getenv(crashDBEnv), os.Getenv(crashRedisEnv)
	if dbURL == "" {
		t.Skip("the worker process of TestKilledWorkersRunRunsAgain")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	reg := framework.NewRegistry()
	register := registerStuck
	if os.Getenv(crashUniqueEnv) != "" {
		register = registerStuckUnique
	}
	if os.Getenv(crashSlowBackoffEnv) != "" {
		register = registerStuckSlowBackoff
	}
	register(reg.Feature("test"), func(ctx context.Context, jc *jobs.Context, in exportInput) error {
		if err := insertRun(ctx, jc, jc.Job, in.Report, "killed worker"); err != nil {
			return err
		}
		time.Sleep(time.Hour)
		return nil
	})
	rt, err := framework.NewRuntime(reg, pool, nil)
	require.NoError(t, err)
	opts, err := redis.ParseURL(redisURL)
	require.NoError(t, err)
	r, err := jobs.New(rt, redis.NewClient(opts), &jobs.Config{Lanes: jobs.Lanes})
	require.NoError(t, err)
	require.NoError(t, r.Run(ctx))
}

// TestKilledWorkersRunRunsAgain: a worker killed (SIGKILL) while it runs a
// job's last allowed attempt (here its only one: MaxRetries -1) does not
// lose the run. asynq archives a run whose lease ran out when its retries
// are used up, so the run's task keeps one attempt in reserve for a dead
// worker: once the lease has run out, another worker runs it again, as the
// README's "delivery is at-least-once" promises. (The test moves the
// lease's expiry into the past instead of waiting a minute for it.)
func TestKilledWorkersRunRunsAgain(t *testing.T) {
	t.Parallel()
	b, ran := killWorkerInRun(t, registerStuck, nil)
	r := b.runner(t, nil) // recovers lease-expired runs when it starts
	select {
	case report := <-ran:
		require.Equal(t, "r1", report)
	case <-time.After(30 * time.Second):
		archived, err := r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		t.Fatalf("the killed worker's run did not run again; archived: %+v", archived)
	}
}

// crashSlowBackoffEnv makes TestCrashWorkerProcess declare test:job:stuck
// with an hour's Backoff (see registerStuckSlowBackoff).
const crashSlowBackoffEnv = "KUMIKO_JOBS_CRASH_SLOW_BACKOFF"

// registerStuckSlowBackoff declares test:job:stuck with retries an hour
// apart.
func registerStuckSlowBackoff(f *framework.Feature, run func(ctx context.Context, jc *jobs.Context, in exportInput) error) {
	jobs.Manual[exportInput](f, "stuck", &jobs.Options{MaxRetries: 3, Backoff: func(int) time.Duration { return time.Hour }}, run)
}

// TestKilledWorkersRunIsNotHeldByTheJobsBackoff: the README promises that a
// run whose worker dies runs again on another worker one to two minutes
// later, once its lease has run out. A dead worker is not a failure of the
// run: the job's Backoff (here an hour) does not delay it.
func TestKilledWorkersRunIsNotHeldByTheJobsBackoff(t *testing.T) {
	t.Parallel()
	b, ran := killWorkerInRun(t, registerStuckSlowBackoff, map[string]string{crashSlowBackoffEnv: "1"})
	r := b.runner(t, nil) // recovers lease-expired runs when it starts
	select {
	case report := <-ran:
		require.Equal(t, "r1", report)
	case <-time.After(30 * time.Second):
		scheduled, err := b.rdb.Keys(context.Background(), "asynq:{*}:retry").Result()
		require.NoError(t, err)
		t.Fatalf("the killed worker's run did not run again within 30 s of its lease running out (retry sets %v, runner %p)", scheduled, r)
	}
}
