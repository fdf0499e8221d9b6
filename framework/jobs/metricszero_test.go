package jobs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestRunCountersStartAtZero: the run counters of every job a process's
// lanes run are on /metrics at 0 from the start, so that increase() and
// rate() see the first archived run (the alert the README asks for)
// instead of a series that appears with it; the jobs of a lane the
// process does not run get none.
func TestRunCountersStartAtZero(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		noop := func(context.Context, *jobs.Context, exportInput) error { return nil }
		jobs.Manual[exportInput](b.f, "in-worker", nil, noop)
		jobs.Manual[exportInput](b.f, "in-api", &jobs.Options{RunIn: framework.RunInAPI}, noop)
	})
	b.runner(t, &jobs.Config{Lanes: []framework.RunIn{framework.RunInWorker}})

	series := func(name, job string) (float64, bool) {
		fams, err := b.prom.Gather()
		require.NoError(t, err)
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				if labels["job"] == job {
					return m.GetCounter().GetValue(), true
				}
			}
		}
		return 0, false
	}
	names := []string{"kumiko_jobs_succeeded_total", "kumiko_jobs_failed_total", "kumiko_jobs_retried_total", "kumiko_jobs_archived_total"}
	eventually(t, "the worker lane's run counters", func() bool {
		_, ok := series(names[0], "test:job:in-worker")
		return ok
	})
	for _, name := range names {
		v, ok := series(name, "test:job:in-worker")
		require.True(t, ok, "%s{job=test:job:in-worker} is not exported before the first run", name)
		require.Zero(t, v, name)
		_, ok = series(name, "test:job:in-api")
		require.False(t, ok, "%s of a lane this process does not run", name)
	}
}
