package orders_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestTotalsSurviveOneTenantsHugeSum: orders:order-totals is one consumer
// shared by every tenant, so an event it fails on stops it for all of
// them. The per-order cap (10^12 cents) alone does not keep one tenant from
// overflowing a bigint sum: about 9.2 million capped orders for one customer
// do (92,000 batches of 100). With a customer's sum already there (seeded,
// as those orders would have left it), the tenant's next order must not
// fail the projection, and another tenant's order after it must still be
// counted.
func TestTotalsSurviveOneTenantsHugeSum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	orders.Register(reg)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	d, err := dispatcher.New(db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "totals", PollOnly: true})
	require.NoError(t, err)
	require.NoError(t, d.Register(ctx))

	const capCents = 1_000_000_000_000
	near := int64(math.MaxInt64 - capCents/2)
	_, err = db.Pool.Exec(ctx, `INSERT INTO order_totals (tenant_id, customer, orders, amount_cents) VALUES ('mallory', 'whale', 9223371, $1)`, near)
	require.NoError(t, err)

	place := func(tenant, customer string, cents int64) {
		t.Helper()
		payload, err := json.Marshal(orders.PlaceInput{Customer: customer, AmountCents: cents})
		require.NoError(t, err)
		_, err = rt.Write(ctx, framework.Call{Principal: framework.Principal{UserID: "u", TenantID: tenant}},
			[]framework.Command{{Type: "orders:write:place", Payload: payload}})
		require.NoError(t, err)
	}
	place("mallory", "whale", capCents)
	place("acme", "alice", 1200)
	db.WaitVisible(t)

	n, err := d.RunOnce(ctx, "orders:order-totals")
	require.NoError(t, err)
	st, err := dispatcher.Status(ctx, db.Pool, "orders:order-totals", "")
	require.NoError(t, err)
	require.Empty(t, st.LastError, "the projection failed")
	require.Equal(t, dispatcher.StateIdle, st.Status)
	require.Equal(t, 2, n, "both events are applied")

	out, err := rt.Query(ctx, framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}},
		framework.Command{Type: "orders:query:totals", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	require.Equal(t, []orders.Total{{Customer: "alice", Orders: 1, AmountCents: 1200}}, out)

	out, err = rt.Query(ctx, framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "mallory"}},
		framework.Command{Type: "orders:query:totals", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err, "the huge tenant can still read its totals")
	require.Equal(t, []orders.Total{{Customer: "whale", Orders: 9223372, AmountCents: math.MaxInt64}}, out,
		"a sum beyond int64 reads as its maximum")
}
