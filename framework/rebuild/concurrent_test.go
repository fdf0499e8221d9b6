package rebuild_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// TestTwoRebuildsAtOnce: rebuilds of two different projections run side by
// side in one process while writers append to both and the live consumers
// run. Each swaps in its own table; afterwards both tables equal a recount
// from the log (no event lost or applied twice by either swap), and nothing
// of either rebuild is left.
func TestTwoRebuildsAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := b.live(t, "test:tally", "orders:order-totals")
	b.rt.OnCommit(func(int) { d.Wake() })
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = d.Run(ctx) })

	var written atomic.Int64
	wctx, stopWriters := context.WithCancel(ctx)
	errs := make(chan error, 2)
	var writers sync.WaitGroup
	writers.Go(func() {
		for n := 0; wctx.Err() == nil; n++ {
			_, err := b.rt.InTx(wctx, fmt.Sprint("t", n%2), framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
				key := fmt.Sprint("k", n%5)
				return tx.Append(framework.Stream{Type: "c", ID: key}, framework.AnyVersion, b.counted.With(counted{Key: key, N: n}))
			})
			if err != nil && wctx.Err() == nil {
				errs <- err
				return
			}
			written.Add(1)
		}
		errs <- nil
	})
	writers.Go(func() {
		call := framework.Call{Principal: framework.Principal{TenantID: "acme", UserID: "writer"}}
		for n := 0; wctx.Err() == nil; n++ {
			in, _ := json.Marshal(orders.PlaceInput{Customer: fmt.Sprint("c", n%3), AmountCents: int64(n)})
			_, err := b.rt.Write(wctx, call, []framework.Command{{Type: "orders:write:place", Payload: in}})
			if err != nil && wctx.Err() == nil {
				errs <- err
				return
			}
			written.Add(1)
		}
		errs <- nil
	})
	for written.Load() < 400 {
		time.Sleep(10 * time.Millisecond)
	}

	before := written.Load()
	results := make([]*rebuild.Result, 2)
	rerrs := make([]error, 2)
	var rebuilds sync.WaitGroup
	for i, name := range []string{"test:tally", "orders:order-totals"} {
		rebuilds.Go(func() {
			results[i], rerrs[i] = rebuild.Rebuild(ctx, b.db.Pool, b.reg, name, &rebuild.Config{BatchSize: 25})
		})
	}
	rebuilds.Wait()
	during := written.Load() - before
	stopWritersAfter(t, &written, 100, stopWriters, &writers, errs)
	require.NoError(t, rerrs[0])
	require.NoError(t, rerrs[1])
	require.Positive(t, during, "writers must have run during the rebuilds")
	t.Logf("rebuilt %d and %d events; %d writes during the rebuilds", results[0].Events, results[1].Events, during)

	deadline := time.Now().Add(30 * time.Second)
	for b.lag(t, "test:tally") > 0 || b.lag(t, "orders:order-totals") > 0 {
		require.True(t, time.Now().Before(deadline), "live consumers did not catch up")
		time.Sleep(10 * time.Millisecond)
	}
	table, recount := b.tallyRows(t)
	require.NotEmpty(t, recount)
	require.Equal(t, recount, table, "tally: no event lost or applied twice")
	rows := func(sql string) []string {
		r, err := b.db.Pool.Query(ctx, sql)
		require.NoError(t, err)
		out, err := pgx.CollectRows(r, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	got := rows(`SELECT tenant_id || '/' || customer || '=' || orders || '/' || amount_cents FROM order_totals ORDER BY 1`)
	want := rows(`SELECT tenant_id || '/' || (payload->>'customer') || '=' || count(*) || '/' || sum((payload->>'amountCents')::bigint)
		FROM events WHERE type = 'orders:event:placed' GROUP BY tenant_id, payload->>'customer' ORDER BY 1`)
	require.Equal(t, want, got, "order totals: no event lost or applied twice")
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
}
