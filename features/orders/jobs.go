package orders

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// InvoiceInput is the payload of orders:query:invoice.
type InvoiceInput struct {
	OrderID string `json:"orderId" validate:"required,uuid"`
}

// Invoice is what orders:query:invoice answers once render-invoice ran.
type Invoice struct {
	OrderID     string    `json:"orderId"`
	Number      string    `json:"number"`
	Customer    string    `json:"customer"`
	AmountCents int64     `json:"amountCents"`
	Body        string    `json:"body"`
	RenderedAt  time.Time `json:"renderedAt"`
}

// registerJobs adds the render-invoice job (worker lane, one invoice per
// placed order) and the invoice query.
func registerJobs(f *framework.Feature, ft *Feature) {
	jobs.OnEvent(f, "render-invoice", ft.Placed, nil, func(ctx context.Context, jc *jobs.Context, e framework.Event[Placed]) error {
		return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
			// The claim commits with the invoice or not at all: however often
			// the job is delivered, one invoice is rendered.
			first, err := jobs.HandledOnce(ctx, tx, "render-invoice:"+e.Payload.OrderID)
			if err != nil || !first {
				return err
			}
			number := fmt.Sprintf("INV-%s-%06d", e.CreatedAt.UTC().Format("20060102"), e.ID)
			body := fmt.Sprintf("Invoice %s\nCustomer: %s\nOrder: %s\nTotal: %d.%02d\n",
				number, e.Payload.Customer, e.Payload.OrderID, e.Payload.AmountCents/100, e.Payload.AmountCents%100)
			_, err = tx.Exec(ctx, `INSERT INTO invoices (tenant_id, order_id, number, customer, amount_cents, body) VALUES ($1, $2, $3, $4, $5, $6)`,
				tx.TenantID(), e.Payload.OrderID, number, e.Payload.Customer, e.Payload.AmountCents, body)
			return err
		})
	})

	framework.Query(f, "invoice", func(ctx context.Context, tx *framework.Tx, in InvoiceInput) (Invoice, error) {
		var inv Invoice
		err := tx.QueryRow(ctx, `SELECT order_id::text, number, customer, amount_cents, body, rendered_at FROM invoices WHERE order_id = $1`, in.OrderID).
			Scan(&inv.OrderID, &inv.Number, &inv.Customer, &inv.AmountCents, &inv.Body, &inv.RenderedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return inv, framework.Errorf(framework.CodeNotFound, "no invoice for order %s yet", in.OrderID)
		}
		return inv, err
	}, nil)
}
