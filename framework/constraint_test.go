package framework_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
)

// lineInput is the payload of constraint-test:write:add-line, which
// inserts its fields as they come: the table's constraints are the only
// check.
type lineInput struct {
	OrderID  string  `json:"orderId"`
	Quantity int     `json:"quantity"`
	Note     *string `json:"note"`
}

const orderLinesSchema = `CREATE TABLE line_orders (
	tenant_id text NOT NULL,
	id        text NOT NULL,
	PRIMARY KEY (tenant_id, id)
);
SELECT kumiko_enable_tenancy('line_orders');
CREATE TABLE order_lines (
	tenant_id text NOT NULL,
	order_id  text NOT NULL,
	quantity  int NOT NULL CONSTRAINT order_lines_quantity_positive CHECK (quantity > 0),
	note      text NOT NULL,
	FOREIGN KEY (tenant_id, order_id) REFERENCES line_orders (tenant_id, id)
);
SELECT kumiko_enable_tenancy('order_lines');`

// A feature table's own constraints reject what a client sent: a foreign
// key naming a missing row, a failed CHECK, a missing NOT NULL value. Each
// is the client's doing, so each is a 4xx with a message that names the
// constraint or column, not a 500; and nothing persists.
func TestConstraintViolationsAreClientErrors(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		framework.Write(r.Feature("constraint-test"), "add-line", func(ctx context.Context, tx *framework.Tx, in lineInput) (struct{}, error) {
			_, err := tx.Exec(ctx, `INSERT INTO order_lines VALUES ($1, $2, $3, $4)`, tx.TenantID(), in.OrderID, in.Quantity, in.Note)
			return struct{}{}, err
		}, nil)
	}, orderLinesSchema, `INSERT INTO line_orders VALUES ('t1', 'o1')`)
	note := "gift"
	for _, tc := range []struct {
		name    string
		in      lineInput
		code    framework.Code
		message string
	}{
		{"foreign key", lineInput{OrderID: "missing", Quantity: 1, Note: &note}, framework.CodeConflict, "order_lines_tenant_id_order_id_fkey"},
		{"check", lineInput{OrderID: "o1", Quantity: 0, Note: &note}, framework.CodeValidation, "order_lines_quantity_positive"},
		{"not null", lineInput{OrderID: "o1", Quantity: 1}, framework.CodeValidation, "note"},
	} {
		_, err := b.write(t, callAs("t1", "alice"), "constraint-test:write:add-line", tc.in)
		e := framework.ToError(err)
		require.Equal(t, tc.code, e.Code, "%s: %v", tc.name, err)
		require.Contains(t, e.Message, tc.message, tc.name)
		require.Zero(t, b.count(t, `SELECT count(*) FROM order_lines`), tc.name)
	}
	_, err := b.write(t, callAs("t1", "alice"), "constraint-test:write:add-line", lineInput{OrderID: "o1", Quantity: 2, Note: &note})
	require.NoError(t, err)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM order_lines`))
}
