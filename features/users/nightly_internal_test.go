package users

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestNightlyReportOnceOnRedelivery: asynq delivers a run at least once (a
// worker that dies after the run's transaction committed but before asynq
// recorded its success runs it again under the same task id), so a second
// run of one tick must write no second report.
func TestNightlyReportOnceOnRedelivery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	Register(reg)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	tick := jobs.Tick{Time: time.Date(2026, 5, 1, 2, 0, 0, 0, time.UTC)}
	for range 2 {
		_, err := rt.InTx(ctx, framework.SystemTenantID, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return nightlyReport(ctx, tx, tick)
		})
		require.NoError(t, err)
	}
	other := jobs.Tick{Time: tick.Time.Add(24 * time.Hour)}
	_, err = rt.InTx(ctx, framework.SystemTenantID, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		return nightlyReport(ctx, tx, other)
	})
	require.NoError(t, err)
	var n, ticks int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT tick) FROM nightly_reports`).Scan(&n, &ticks))
	require.Equal(t, 2, ticks, "both ticks reported")
	require.Equal(t, 2, n, "one report per tick, however often its run is delivered")
}
