package rebuild_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/rebuild"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// TestRebuildKeepsTheTenantRolesGrants: a projection table without
// kumiko_enable_tenancy that the tenant role may use through a plain grant
// (README, "The HTTP contract": a feature table needs kumiko_enable_tenancy
// or a grant). Its handlers run as the tenant role, live and in the
// replay, and tenants' queries read it. The rebuild's new table must carry
// the grant: without it, every replayed event failed with "permission
// denied" and such a projection could never be rebuilt.
func TestRebuildKeepsTheTenantRolesGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("global")
	ev := framework.DefineEvent[counted](f, "counted", nil)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE global_tally (key text PRIMARY KEY, total bigint NOT NULL, note text);
		GRANT SELECT, INSERT ON global_tally TO `+tenancy.Role+`;
		GRANT UPDATE (total), UPDATE (note), REFERENCES (note) ON global_tally TO `+tenancy.Role)
	require.NoError(t, err)
	p := framework.MultiStreamProjection(f, "tally", &framework.ProjectionOptions{Table: "global_tally"})
	framework.On(p, ev, func(ctx context.Context, tx *framework.Tx, e framework.Event[counted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO global_tally AS g VALUES ($1, $2)
			ON CONFLICT (key) DO UPDATE SET total = g.total + EXCLUDED.total`, e.Payload.Key, e.Payload.N)
		return err
	})
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	for n := 1; n <= 10; n++ {
		_, err := rt.InTx(ctx, "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "c", ID: "k"}, framework.AnyVersion, ev.With(counted{Key: "k", N: n}))
		})
		require.NoError(t, err)
	}
	db.WaitVisible(t)
	d, err := dispatcher.New(db.Pool, reg, []dispatcher.Consumer{dispatcher.FromProjection(p)}, &dispatcher.Config{InstanceID: "live"})
	require.NoError(t, err)
	require.NoError(t, d.Register(ctx))
	n, err := d.RunOnce(ctx, "global:tally")
	require.NoError(t, err)
	require.Equal(t, 10, n, "the live consumer applies every event as the tenant role")

	res, err := rebuild.Rebuild(ctx, db.Pool, reg, "global:tally", &rebuild.Config{BatchSize: 3})
	require.NoError(t, err)
	require.EqualValues(t, 10, res.Events)

	// A tenant still reads and writes the table after the swap.
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, tenancy.Begin(ctx, conn.Conn(), "acme", tenancy.Options{}))
	var total int64
	err = conn.QueryRow(ctx, `SELECT total FROM global_tally WHERE key = 'k'`).Scan(&total)
	_, rerr := conn.Exec(ctx, `ROLLBACK`)
	require.NoError(t, err)
	require.NoError(t, rerr)
	require.EqualValues(t, 55, total)
	var privileges string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT concat_ws(',',
		CASE WHEN has_table_privilege($1, 'global_tally', 'DELETE') THEN 'delete' END,
		CASE WHEN has_table_privilege($1, 'global_tally', 'UPDATE') THEN 'update' END,
		CASE WHEN has_column_privilege($1, 'global_tally', 'note', 'UPDATE') THEN 'update(note)' END,
		CASE WHEN has_column_privilege($1, 'global_tally', 'note', 'REFERENCES') THEN 'references(note)' END,
		CASE WHEN has_column_privilege($1, 'global_tally', 'key', 'UPDATE') THEN 'update(key)' END)`, tenancy.Role).Scan(&privileges))
	require.Equal(t, "update(note),references(note)", privileges, "the grants are copied, none added")
}
