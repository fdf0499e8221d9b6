package rebuild_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// TestRebuildWithSkippedEventReplaysTheWholeLog: a SkipApplyErrors
// projection whose handler fails on an early event. The rebuild skips it
// (a dead letter, as the live consumer does) and must go on replaying to
// the end of the log before it swaps: the table swapped in holds every
// other event at once. A pass that skipped an event delivers less than a
// batch; taken for the end of the log, it used to end the catch-up there,
// and the swap (at most 20 more passes) put in a table missing most of the
// history, which readers saw until the live consumer had replayed the rest.
func TestRebuildWithSkippedEventReplaysTheWholeLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("lenient")
	ev := framework.DefineEvent[counted](f, "counted", nil)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE lenient (tenant_id text NOT NULL, n int NOT NULL);
		SELECT kumiko_enable_tenancy('lenient')`)
	require.NoError(t, err)
	p := framework.MultiStreamProjection(f, "lenient", &framework.ProjectionOptions{Table: "lenient", SkipApplyErrors: true})
	framework.On(p, ev, func(ctx context.Context, tx *framework.Tx, e framework.Event[counted]) error {
		if e.Payload.N == 0 {
			return fmt.Errorf("cannot count %d", e.Payload.N)
		}
		_, err := tx.Exec(ctx, `INSERT INTO lenient VALUES ($1, $2)`, e.TenantID, e.Payload.N)
		return err
	})
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	const n = 300
	// One transaction; its streams are written in sorted order, so event 0
	// (stream "0") is the first of the log.
	_, err = rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		for i := range n {
			if err := tx.Append(framework.Stream{Type: "c", ID: fmt.Sprint(i)}, framework.NoStream, ev.With(counted{Key: "k", N: i})); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	db.WaitVisible(t)

	var swapAt int64 = -1
	res, err := rebuild.Rebuild(ctx, db.Pool, reg, "lenient:lenient", &rebuild.Config{
		BatchSize: 5,
		Progress: func(p rebuild.Progress) {
			if p.Phase == rebuild.PhaseSwap && swapAt < 0 {
				swapAt = p.Events
			}
		},
	})
	require.NoError(t, err)
	var rows int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM lenient`).Scan(&rows))
	require.EqualValues(t, n-1, rows, "the swapped-in table holds every event but the skipped one")
	require.GreaterOrEqual(t, swapAt, int64(n-1-5), "the catch-up ended before the end of the log")
	var dead []int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT array_agg((e.payload->>'n')::bigint) FROM event_dead_letters d JOIN events e USING (position)
		WHERE d.consumer = 'lenient:lenient'`).Scan(&dead))
	require.Equal(t, []int64{0}, dead, "the skipped event is the live consumer's dead letter")
	require.Equal(t, `"public"."lenient"`, res.Table)
}
