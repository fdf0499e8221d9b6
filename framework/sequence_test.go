package framework_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
)

// A feature table with a serial column (and one with an identity column) is
// usable after the one kumiko_enable_tenancy call: the tenant role may draw
// from the table's own sequences, so a write does not fail with a 403 for
// a privilege the migration forgot to grant.
func TestTenantTableWithSerialColumn(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		framework.Write(r.Feature("serial-test"), "add", func(ctx context.Context, tx *framework.Tx, in struct {
			Body string `json:"body"`
		}) (int64, error) {
			var id, n int64
			if err := tx.QueryRow(ctx, `INSERT INTO serial_notes (tenant_id, body) VALUES ($1, $2) RETURNING id`,
				tx.TenantID(), in.Body).Scan(&id); err != nil {
				return 0, err
			}
			err := tx.QueryRow(ctx, `INSERT INTO identity_notes (tenant_id, body) VALUES ($1, $2) RETURNING id`,
				tx.TenantID(), in.Body).Scan(&n)
			return id + n, err
		}, nil)
	}, `CREATE TABLE serial_notes (
	tenant_id text NOT NULL,
	id        bigserial,
	body      text NOT NULL,
	PRIMARY KEY (tenant_id, id)
);
SELECT kumiko_enable_tenancy('serial_notes');
CREATE TABLE identity_notes (
	tenant_id text NOT NULL,
	id        bigint GENERATED ALWAYS AS IDENTITY,
	body      text NOT NULL,
	PRIMARY KEY (tenant_id, id)
);
SELECT kumiko_enable_tenancy('identity_notes');`)
	out, err := b.write(t, callAs("t1", "alice"), "serial-test:write:add", map[string]string{"body": "hello"})
	require.NoError(t, err)
	require.Equal(t, int64(2), out)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM serial_notes`))
}
