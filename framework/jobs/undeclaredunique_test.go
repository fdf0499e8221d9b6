package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestUndeclaredUniqueRunArchivedHoldsNoWindow: a run of a Unique job
// that a worker of another release (one that does not declare the job)
// takes fails there and, on its last attempt, is archived by it. Like any
// archived run it holds no window: an equal dispatch of the release that
// declares the job runs, the archived run is listed and counted, and an
// operator's retry of it is refused while the equal run holds the window.
func TestUndeclaredUniqueRunArchivedHoldsNoWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "single", &jobs.Options{Unique: time.Hour, MaxRetries: -1}, func(context.Context, *jobs.Context, exportInput) error {
			return nil
		})
	})
	// The other release declares another job of the worker lane only.
	reg := framework.NewRegistry()
	jobs.Manual[exportInput](reg.Feature("test"), "other", nil, func(context.Context, *jobs.Context, exportInput) error { return nil })
	rt, err := framework.NewRuntime(reg, b.db.Pool, nil)
	require.NoError(t, err)
	prom := prometheus.NewRegistry()
	other, err := jobs.New(rt, b.rdb, &jobs.Config{Lanes: jobs.Lanes, Metrics: prom, ShutdownTimeout: 2 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- other.Run(ctx) }()

	client, err := jobs.New(b.rt, b.rdb, nil)
	require.NoError(t, err)
	in := exportInput{Report: "r"}
	first, err := client.Client().Dispatch(context.Background(), "test:job:single", in, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	eventually(t, "the other release archived the run", func() bool {
		run, err := client.Inspector().Get(context.Background(), "", first)
		return err == nil && run.State == jobs.StateArchived
	})
	cancel()
	require.NoError(t, <-done)
	fams, err := prom.Gather()
	require.NoError(t, err)
	var archived float64
	for _, f := range fams {
		if f.GetName() == "kumiko_jobs_archived_total" {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "job" && l.GetValue() == "test:job:single" {
						archived += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	require.Equal(t, float64(1), archived, "counted as archived under its own name")
	list, err := client.Inspector().List(context.Background(), &jobs.ListOptions{State: jobs.StateArchived})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, first, list[0].ID)
	require.Contains(t, list[0].LastError, "not declared")

	second, err := client.Client().Dispatch(context.Background(), "test:job:single", in, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err, "the archived run holds no window")
	_, err = client.Client().Dispatch(context.Background(), "test:job:single", in, &jobs.DispatchOptions{TenantID: "acme"})
	require.ErrorIs(t, err, jobs.ErrDuplicate, "the waiting equal run holds the window")
	_, err = client.Inspector().Retry(context.Background(), "", first)
	require.ErrorIs(t, err, jobs.ErrDuplicate, "the archived run cannot take the window the equal run holds")
	run, err := client.Inspector().Get(context.Background(), "", second)
	require.NoError(t, err)
	require.Equal(t, jobs.StatePending, run.State)
}
