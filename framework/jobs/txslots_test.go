package jobs_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestMaxTransactionsBoundsRunsInATransaction: with MaxTransactions 2, at
// most two of a lane's runs are inside InTx at once (each holds a database
// connection there, here for 150 ms), though the lane runs ten at once;
// the others wait for a slot and all complete. Without the bound, the
// runs of a lane can hold every connection of the pool.
func TestMaxTransactionsBoundsRunsInATransaction(t *testing.T) {
	t.Parallel()
	var inTx, most, active, mostActive atomic.Int32
	raise := func(to *atomic.Int32, n int32) {
		for m := to.Load(); n > m && !to.CompareAndSwap(m, n); m = to.Load() {
		}
	}
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "hold", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			raise(&mostActive, active.Add(1))
			defer active.Add(-1)
			return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
				raise(&most, inTx.Add(1))
				defer inTx.Add(-1)
				if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.15)`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO runs (tenant_id, job, ref) VALUES ($1, $2, $3)`, jc.TenantID, jc.Job, in.Report)
				return err
			})
		})
	})
	r := b.runner(t, &jobs.Config{Lanes: jobs.Lanes, MaxTransactions: 2})
	const runs = 8
	for i := range runs {
		_, err := r.Client().Dispatch(context.Background(), "test:job:hold", exportInput{Report: fmt.Sprint("r", i)}, &jobs.DispatchOptions{TenantID: "acme"})
		require.NoError(t, err)
	}
	eventually(t, "every run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == runs })
	require.EqualValues(t, 2, most.Load(), "runs inside InTx at once")
	require.Greater(t, mostActive.Load(), int32(2), "runs at once in the lane: the others waited for a slot")
}

// A negative bound set in code is refused, not passed on: asynq reads a
// concurrency below 1 as one run per CPU, and a negative MaxTransactions
// would silently mean no bound.
func TestNegativeBoundsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, cfg := range []*jobs.Config{{Concurrency: -1}, {MaxTransactions: -2}} {
		_, err := jobs.New(b.rt, b.rdb, cfg)
		require.Error(t, err)
		require.Contains(t, err.Error(), "must not be negative")
	}
}
