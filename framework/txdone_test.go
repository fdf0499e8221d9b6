package framework_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
)

// A Tx kept past its handler fails every call with ErrTxDone: its
// connection went back to the pool, where a statement would run outside
// the transaction and outside the tenant's scope (seeing every tenant's
// rows), or inside another request's transaction; and an Append would be
// dropped without a word.
func TestTxUsedAfterItsTransactionEndedFails(t *testing.T) {
	t.Parallel()
	var kept *framework.Tx
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		framework.Write(r.Feature("tx-test"), "keep", func(ctx context.Context, tx *framework.Tx, _ struct{}) (struct{}, error) {
			kept = tx
			var n int64
			return struct{}{}, tx.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
		}, nil)
	})
	b.place(t, "t1", "ada")
	_, err := b.write(t, callAs("t2", "bob"), "tx-test:write:keep", struct{}{})
	require.NoError(t, err)
	require.NotNil(t, kept)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var n int64
	err = kept.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	require.ErrorIs(t, err, framework.ErrTxDone, "tenant t2's kept Tx counted %d orders", n)
	_, err = kept.Exec(ctx, `UPDATE orders SET customer = 'mallory'`)
	require.ErrorIs(t, err, framework.ErrTxDone)
	rows, err := kept.Query(ctx, `SELECT 1`)
	if rows != nil {
		rows.Close()
	}
	require.ErrorIs(t, err, framework.ErrTxDone)
	id := uuid.NewString()
	err = kept.Append(orderStream(id), framework.NoStream, b.orders.Placed.With(orders.Placed{OrderID: id, Customer: "eve"}))
	require.ErrorIs(t, err, framework.ErrTxDone)
	_, err = kept.Flush(ctx)
	require.ErrorIs(t, err, framework.ErrTxDone)
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM orders WHERE customer = 'mallory'`))

	// The same for a query handler's Tx and an InTx's, also after a rollback.
	_, err = b.rt.InTx(t.Context(), "t2", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		kept = tx
		return framework.ErrConflict
	})
	require.ErrorIs(t, err, framework.ErrConflict)
	_, err = kept.Exec(ctx, `SELECT 1`)
	require.ErrorIs(t, err, framework.ErrTxDone)
	require.Equal(t, framework.CodeInternal, framework.ToError(framework.ErrTxDone).Code)
}
