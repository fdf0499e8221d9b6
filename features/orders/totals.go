package orders

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/framework"
)

// Total is one customer's row of orders:query:totals.
type Total struct {
	Customer string `json:"customer"`
	Orders   int64  `json:"orders"`
	// AmountCents is the sum of the customer's orders that are not
	// cancelled. A sum beyond the int64 maximum (some 9.2 million orders
	// at PlaceInput's cap) reads as that maximum.
	AmountCents int64 `json:"amountCents"`
}

// TotalsInput is the (empty) payload of orders:query:totals.
type TotalsInput struct{}

// registerTotals adds the order-totals projection (a table of order count
// and amount per customer, cancelled orders subtracted) and its query.
//
// The projection is one consumer shared by every tenant: an event it fails
// on stops it for all of them. Its amount column is numeric (migration
// 00010), so no tenant's sum can overflow it, however many orders it
// places.
func registerTotals(f *framework.Feature, ft *Feature) {
	p := framework.MultiStreamProjection(f, "order-totals", &framework.ProjectionOptions{Table: "order_totals"})
	// Queue defers the upsert to the pass's next round trip: a pass of 500
	// placed events sends them in one pipeline with its COMMIT.
	framework.On(p, ft.Placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[Placed]) error {
		return tx.Queue(ctx, `INSERT INTO order_totals AS t (tenant_id, customer, orders, amount_cents) VALUES ($1, $2, 1, $3)
			ON CONFLICT (tenant_id, customer) DO UPDATE SET orders = t.orders + 1, amount_cents = t.amount_cents + EXCLUDED.amount_cents`,
			e.TenantID, e.Payload.Customer, e.Payload.AmountCents)
	})
	framework.On(p, ft.Cancelled, func(ctx context.Context, tx *framework.Tx, e framework.Event[Cancelled]) error {
		// The cancelled event names only the order: read what it placed from
		// the order's own stream.
		placed, err := tx.ReadStream(ctx, e.Stream, framework.AsOf{Version: 1})
		if err != nil || len(placed) == 0 {
			return err
		}
		p, ok, err := ft.Placed.Decode(placed[0])
		if err != nil || !ok {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE order_totals SET orders = orders - 1, amount_cents = amount_cents - $2 WHERE customer = $1`,
			p.Payload.Customer, p.Payload.AmountCents)
		return err
	})

	framework.Query(f, "totals", func(ctx context.Context, tx *framework.Tx, _ TotalsInput) ([]Total, error) {
		rows, err := tx.Query(ctx, `SELECT customer, orders, LEAST(amount_cents, 9223372036854775807)::bigint FROM order_totals ORDER BY customer`)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Total, error) {
			var t Total
			err := r.Scan(&t.Customer, &t.Orders, &t.AmountCents)
			return t, err
		})
	}, nil)
}
