// Package orders is the sample feature Kumiko's docs walk through: placing
// and cancelling orders, reading them back, with every change recorded as an
// event in the order's stream. It uses only the public framework API.
package orders

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/framework"
)

// Placed is the payload of orders:event:placed.
type Placed struct {
	OrderID     string `json:"orderId" validate:"required,uuid"`
	Customer    string `json:"customer" validate:"required,max=200"`
	AmountCents int64  `json:"amountCents" validate:"gte=0"`
}

// Cancelled is the payload of orders:event:cancelled.
type Cancelled struct {
	OrderID string `json:"orderId" validate:"required,uuid"`
}

// PlaceInput is the payload of orders:write:place. The amount is capped
// (ten billion in the currency's units) so that it fits the orders table's
// bigint with room to spare. The cap alone does not protect the sums of
// orders:order-totals (some 9.2 million capped orders of one customer would
// overflow a bigint, and that projection is shared by every tenant: an
// upsert failing on one tenant's event would stop it for all of them), so
// their column is numeric.
type PlaceInput struct {
	Customer    string `json:"customer" validate:"required,max=200"`
	AmountCents int64  `json:"amountCents" validate:"gte=0,lte=1000000000000"`
}

// CancelInput is the payload of orders:write:cancel.
type CancelInput struct {
	OrderID         string `json:"orderId" validate:"required,uuid"`
	ExpectedVersion int64  `json:"expectedVersion" validate:"gte=1"`
}

// WriteResult is what both writes answer.
type WriteResult struct {
	ID      string `json:"id"`
	Version int64  `json:"version"`
}

// GetInput is the payload of orders:query:get.
type GetInput struct {
	OrderID string `json:"orderId" validate:"required,uuid"`
}

// Order is one order as the queries return it.
type Order struct {
	ID          string    `json:"id"`
	Customer    string    `json:"customer"`
	AmountCents int64     `json:"amountCents"`
	Status      string    `json:"status"`
	Version     int64     `json:"version"`
	CreatedAt   time.Time `json:"createdAt"`
}

// ListInput is the payload of orders:query:list.
type ListInput struct {
	Limit int    `json:"limit" validate:"omitempty,min=1,max=200"`
	After string `json:"after" validate:"omitempty,uuid"`
}

// ListResult is one page of orders, oldest first; pass Next as After for
// the following page ("" at the end).
type ListResult struct {
	Items []Order `json:"items"`
	Next  string  `json:"next,omitempty"`
}

// Feature is the registered orders feature: its event handles, for other
// features and tests.
type Feature struct {
	// Placed is orders:event:placed.
	Placed framework.EventType[Placed]
	// Cancelled is orders:event:cancelled.
	Cancelled framework.EventType[Cancelled]
}

// StreamType is the aggregate type of an order's stream ("order/<id>").
const StreamType = "order"

// state is the order aggregate folded from its stream.
type state struct {
	Exists    bool
	Cancelled bool
}

// Register adds the orders feature to r.
func Register(r *framework.Registry) *Feature {
	f := r.Feature("orders")
	ft := &Feature{
		Placed:    framework.DefineEvent[Placed](f, "placed", nil),
		Cancelled: framework.DefineEvent[Cancelled](f, "cancelled", nil),
	}
	agg := framework.NewAggregate[state](StreamType)
	framework.Evolve(agg, ft.Placed, func(s *state, _ framework.Event[Placed]) { s.Exists = true })
	framework.Evolve(agg, ft.Cancelled, func(s *state, _ framework.Event[Cancelled]) { s.Cancelled = true })

	framework.Write(f, "place", func(ctx context.Context, tx *framework.Tx, in PlaceInput) (WriteResult, error) {
		id := uuid.Must(uuid.NewV7()).String()
		if _, err := tx.Exec(ctx, `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ($1, $2, $3, $4)`,
			tx.TenantID(), id, in.Customer, in.AmountCents); err != nil {
			return WriteResult{}, err
		}
		err := tx.Append(agg.Stream(id), framework.NoStream,
			ft.Placed.With(Placed{OrderID: id, Customer: in.Customer, AmountCents: in.AmountCents}))
		return WriteResult{ID: id, Version: 1}, err
	}, nil)

	framework.Write(f, "cancel", func(ctx context.Context, tx *framework.Tx, in CancelInput) (WriteResult, error) {
		id := canonicalID(in.OrderID) // the stream's spelling: the validator accepts upper case
		s, version, err := agg.LoadForWriting(ctx, tx, id)
		if err != nil {
			return WriteResult{}, err
		}
		switch {
		case !s.Exists:
			return WriteResult{}, framework.Errorf(framework.CodeNotFound, "order %s not found", id)
		case version != in.ExpectedVersion:
			return WriteResult{}, framework.NewConcurrencyError(agg.Stream(id), in.ExpectedVersion, version)
		case s.Cancelled:
			return WriteResult{}, framework.Errorf(framework.CodeConflict, "order %s is already cancelled", id)
		}
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'cancelled', version = $2 WHERE id = $1`, id, version+1); err != nil {
			return WriteResult{}, err
		}
		err = tx.Append(agg.Stream(id), in.ExpectedVersion, ft.Cancelled.With(Cancelled{OrderID: id}))
		return WriteResult{ID: id, Version: version + 1}, err
	}, nil)

	framework.Query(f, "get", func(ctx context.Context, tx *framework.Tx, in GetInput) (Order, error) {
		var o Order
		err := tx.QueryRow(ctx, `SELECT id::text, customer, amount_cents, status, version, created_at FROM orders WHERE id = $1`, in.OrderID).
			Scan(&o.ID, &o.Customer, &o.AmountCents, &o.Status, &o.Version, &o.CreatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return o, framework.Errorf(framework.CodeNotFound, "order %s not found", in.OrderID)
		}
		return o, err
	}, &framework.QueryOptions{
		// A single-entity read: cached by order id, dropped from the cache
		// when the order's stream gets an event that changes the row. Both
		// sides use the canonical spelling of the id: Postgres reads an
		// upper-case uuid as the same order, and the event always carries
		// the lower-case one.
		Cache: framework.CacheBy(5*time.Minute, func(in GetInput) string { return canonicalID(in.OrderID) },
			framework.InvalidatedBy(ft.Cancelled, func(e framework.Event[Cancelled]) string { return canonicalID(e.Payload.OrderID) })),
	})

	framework.Query(f, "list", func(ctx context.Context, tx *framework.Tx, in ListInput) (ListResult, error) {
		limit := in.Limit
		if limit == 0 {
			limit = 50
		}
		after := in.After
		if after == "" {
			after = uuid.Nil.String()
		}
		rows, err := tx.Query(ctx, `SELECT id::text, customer, amount_cents, status, version, created_at FROM orders
			WHERE id > $1::uuid ORDER BY id LIMIT $2`, after, limit+1)
		if err != nil {
			return ListResult{}, err
		}
		items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Order, error) {
			var o Order
			err := r.Scan(&o.ID, &o.Customer, &o.AmountCents, &o.Status, &o.Version, &o.CreatedAt)
			return o, err
		})
		if err != nil {
			return ListResult{}, err
		}
		res := ListResult{Items: items}
		if len(items) > limit {
			res.Items = items[:limit]
			res.Next = items[limit-1].ID
		}
		if res.Items == nil {
			res.Items = []Order{}
		}
		return res, nil
	}, nil)
	registerTotals(f, ft)
	registerJobs(f, ft)
	return ft
}

// canonicalID is the canonical (lower-case, hyphenated) spelling of an
// order id, the one its stream and its cache entry are named by, so that
// every spelling of one order finds them. An id that is no uuid (the
// validator lets none through) is returned as it is.
func canonicalID(id string) string {
	if u, err := uuid.Parse(id); err == nil {
		return u.String()
	}
	return id
}
