package jobs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestLaneRouting runs two processes' runners on one Redis, one consuming
// only the api lane and one only the worker lane, with the same jobs: an
// api-lane job only ever runs on the api-lane runner and a worker-lane job
// only on the worker-lane runner.
func TestLaneRouting(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	type process struct {
		label  string
		lanes  []framework.RunIn
		runner *jobs.Runner
	}
	procs := []*process{{label: "api-process", lanes: []framework.RunIn{framework.RunInAPI}}, {label: "worker-process", lanes: []framework.RunIn{framework.RunInWorker}}}
	for _, p := range procs {
		reg := framework.NewRegistry()
		f := reg.Feature("test")
		for _, lane := range jobs.Lanes {
			name := string(lane) + "-job"
			jobs.Manual[noted](f, name, &jobs.Options{RunIn: lane}, func(ctx context.Context, jc *jobs.Context, in noted) error {
				return insertRun(ctx, jc, jc.Job, fmt.Sprint(in.N), p.label)
			})
		}
		rt, err := framework.NewRuntime(reg, b.db.Pool, nil)
		require.NoError(t, err)
		r, err := jobs.New(rt, b.rdb, &jobs.Config{Lanes: p.lanes, Metrics: prometheus.NewRegistry(), ShutdownTimeout: 2 * time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		p.runner = r
	}
	// Both processes enqueue both jobs.
	for i := range 20 {
		for _, p := range procs {
			for _, lane := range jobs.Lanes {
				_, err := p.runner.Client().Dispatch(context.Background(), "test:job:"+string(lane)+"-job", noted{N: i}, &jobs.DispatchOptions{TenantID: "acme"})
				require.NoError(t, err)
			}
		}
	}
	eventually(t, "80 runs", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 80 })
	require.Equal(t, 40, b.count(t, `SELECT count(*) FROM runs WHERE job = 'test:job:api-job' AND info = 'api-process'`))
	require.Equal(t, 40, b.count(t, `SELECT count(*) FROM runs WHERE job = 'test:job:worker-job' AND info = 'worker-process'`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM runs WHERE (job = 'test:job:api-job') <> (info = 'api-process')`))
	// The runs sat in the lanes' own queues.
	require.Equal(t, "kumiko-jobs-api", jobs.QueueName("", framework.RunInAPI, jobs.PriorityDefault))
	require.Equal(t, "kumiko-jobs-worker-high", jobs.QueueName("", framework.RunInWorker, jobs.PriorityHigh))
}

// TestEnqueueOnlyRunnerConsumesNothing: a runner without lanes (an api
// process without RunLocalJobs) enqueues but never runs anything.
func TestEnqueueOnlyRunnerConsumesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Manual[noted](b.f, "work", nil, func(ctx context.Context, jc *jobs.Context, in noted) error {
			return insertRun(ctx, jc, jc.Job, fmt.Sprint(in.N), "")
		})
	})
	r := b.runner(t, &jobs.Config{})
	id, err := r.Client().Dispatch(context.Background(), "test:job:work", noted{N: 1}, nil)
	require.NoError(t, err)
	// Many poll intervals (10 ms) of a lane: a runner that consumed one
	// would have run it by now.
	time.Sleep(300 * time.Millisecond)
	require.Zero(t, b.count(t, `SELECT count(*) FROM runs`), "a runner without lanes ran a job")
	in := r.Inspector()
	pending, err := in.List(context.Background(), &jobs.ListOptions{State: jobs.StatePending, Lane: framework.RunInWorker})
	require.NoError(t, err)
	require.Len(t, pending, 1)
	require.Equal(t, id, pending[0].ID)
	require.Equal(t, "system", pending[0].TenantID)
	depth, err := in.Depth(context.Background(), framework.RunInWorker)
	require.NoError(t, err)
	require.Equal(t, 1, depth)

	// A worker-lane runner picks it up.
	b.runner(t, &jobs.Config{Lanes: []framework.RunIn{framework.RunInWorker}})
	eventually(t, "the run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 1 })
}

// TestRunsLeftInAnotherPriorityQueueStillRun: a release that changes a
// job's Priority leaves the runs the old build enqueued (and archived runs
// an operator retries later) in the queue of the old priority. A lane
// listened only to the queues of its jobs' current priorities, so those
// runs waited forever.
func TestRunsLeftInAnotherPriorityQueueStillRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	build := func(p jobs.Priority, lanes []framework.RunIn) *jobs.Runner {
		reg := framework.NewRegistry()
		f := reg.Feature("test")
		jobs.Manual[noted](f, "work", &jobs.Options{Priority: p}, func(ctx context.Context, jc *jobs.Context, in noted) error {
			return insertRun(ctx, jc, jc.Job, fmt.Sprint(in.N), string(p))
		})
		rt, err := framework.NewRuntime(reg, b.db.Pool, nil)
		require.NoError(t, err)
		r, err := jobs.New(rt, b.rdb, &jobs.Config{Lanes: lanes, Metrics: prometheus.NewRegistry(), ShutdownTimeout: 2 * time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
		return r
	}
	// The old build (high priority) enqueues and stops before running it.
	old := build(jobs.PriorityHigh, nil)
	_, err := old.Client().Dispatch(context.Background(), "test:job:work", noted{N: 1}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	// The new build has the job at the default priority.
	r := build(jobs.PriorityDefault, []framework.RunIn{framework.RunInWorker})
	eventually(t, "the run left in the high-priority queue", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 1 })
	// New runs go to the default queue and run too.
	_, err = r.Client().Dispatch(context.Background(), "test:job:work", noted{N: 2}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	eventually(t, "the new run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 2 })
}
