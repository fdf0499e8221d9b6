package rebuild_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/rebuild"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// policiesSQL lists a table's row-level security: whether it is enabled
// and forced, and every policy as pg_policies shows it.
const policiesSQL = `SELECT c.relrowsecurity, c.relforcerowsecurity, coalesce((
  SELECT array_agg(concat_ws(' | ', p.policyname, p.permissive, p.roles::text, p.cmd, p.qual, p.with_check) ORDER BY p.policyname)
  FROM pg_policies p WHERE p.schemaname = 'public' AND p.tablename = c.relname), '{}')
FROM pg_class c WHERE c.oid = $1::regclass`

// tableRLS is a table's row-level security as policiesSQL reads it.
type tableRLS struct {
	Enabled, Forced bool
	Policies        []string
}

// readRLS returns table's row-level security.
func readRLS(t *testing.T, db *kumikotest.DB, table string) tableRLS {
	t.Helper()
	var r tableRLS
	require.NoError(t, db.Pool.QueryRow(context.Background(), policiesSQL, table).Scan(&r.Enabled, &r.Forced, &r.Policies))
	return r
}

// TestRebuildKeepsHandWrittenPolicies: a projection table under row-level
// security of its own (policies written by hand on an owner column, no
// tenant_id, one of them restrictive). The rebuild put the new table under
// kumiko_enable_tenancy, whose policies name tenant_id: it failed with
// `column "tenant_id" does not exist` in the middle of creating the shadow
// table. (And a table with tenant_id lost its other policies, a
// restrictive one among them.) The new table gets the live table's
// policies as they are, with RLS enabled and forced as it was.
func TestRebuildKeepsHandWrittenPolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("owned")
	ev := framework.DefineEvent[counted](f, "counted", nil)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE owned_tally (owner text NOT NULL, key text NOT NULL, total bigint NOT NULL,
			PRIMARY KEY (owner, key));
		ALTER TABLE owned_tally ENABLE ROW LEVEL SECURITY;
		ALTER TABLE owned_tally FORCE ROW LEVEL SECURITY;
		CREATE POLICY owned_rows ON owned_tally TO `+tenancy.Role+`
			USING (owner = current_setting('kumiko.tenant_id', true))
			WITH CHECK (owner = current_setting('kumiko.tenant_id', true));
		CREATE POLICY no_reserved_keys ON owned_tally AS RESTRICTIVE FOR INSERT TO `+tenancy.Role+`
			WITH CHECK (key <> 'reserved');
		GRANT SELECT, INSERT, UPDATE ON owned_tally TO `+tenancy.Role)
	require.NoError(t, err)
	p := framework.MultiStreamProjection(f, "tally", &framework.ProjectionOptions{Table: "owned_tally"})
	framework.On(p, ev, func(ctx context.Context, tx *framework.Tx, e framework.Event[counted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO owned_tally AS o VALUES (current_setting('kumiko.tenant_id'), $1, $2)
			ON CONFLICT (owner, key) DO UPDATE SET total = o.total + EXCLUDED.total`, e.Payload.Key, e.Payload.N)
		return err
	})
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	for n := 1; n <= 10; n++ {
		for _, tenant := range []string{"acme", "globex"} {
			_, err := rt.InTx(ctx, tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
				return tx.Append(framework.Stream{Type: "c", ID: "k"}, framework.AnyVersion, ev.With(counted{Key: "k", N: n}))
			})
			require.NoError(t, err)
		}
	}
	db.WaitVisible(t)
	d, err := dispatcher.New(db.Pool, reg, []dispatcher.Consumer{dispatcher.FromProjection(p)}, &dispatcher.Config{InstanceID: "live"})
	require.NoError(t, err)
	require.NoError(t, d.Register(ctx))
	n, err := d.RunOnce(ctx, "owned:tally")
	require.NoError(t, err)
	require.Equal(t, 20, n, "the live consumer applies every event as the tenant role")
	before := readRLS(t, db, "owned_tally")
	require.Len(t, before.Policies, 2)

	res, err := rebuild.Rebuild(ctx, db.Pool, reg, "owned:tally", &rebuild.Config{BatchSize: 7})
	require.NoError(t, err)
	require.EqualValues(t, 20, res.Events)
	require.Equal(t, before, readRLS(t, db, "owned_tally"), "the new table has the live table's row-level security")

	// A tenant sees its own row only, and the restrictive policy holds.
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, tenancy.Begin(ctx, conn.Conn(), "acme", tenancy.Options{}))
	rows, err := conn.Query(ctx, `SELECT owner || ':' || total FROM owned_tally`)
	require.NoError(t, err)
	seen, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	_, insErr := conn.Exec(ctx, `INSERT INTO owned_tally VALUES ('acme', 'reserved', 1)`)
	_, err = conn.Exec(ctx, `ROLLBACK`)
	require.NoError(t, err)
	require.Equal(t, []string{"acme:55"}, seen)
	require.ErrorContains(t, insErr, "row-level security")
}
