package dispatcher_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

type scopeNote struct {
	N     int  `json:"n"`
	Touch bool `json:"touch"`
}

// TestHandlersRunInTheirEventsTenantScope interleaves events of two tenants
// and events whose handler sends no statement (the tenant switch is
// deferred until a handler uses the database): every statement a handler
// sends runs as the restricted role scoped to its event's tenant and sees
// only that tenant's rows, and a system consumer sees all of them.
func TestHandlersRunInTheirEventsTenantScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE scope_seen (tenant_id text NOT NULL, n int NOT NULL, setting text, role text, visible bigint);
		SELECT kumiko_enable_tenancy('scope_seen')`)
	require.NoError(t, err)
	reg := framework.NewRegistry()
	f := reg.Feature("scope")
	ev := framework.DefineEvent[scopeNote](f, "noted", nil)
	p := framework.MultiStreamProjection(f, "tenant", nil)
	framework.On(p, ev, func(ctx context.Context, tx *framework.Tx, e framework.Event[scopeNote]) error {
		if !e.Payload.Touch {
			return nil // no statement: no switch needed
		}
		_, err := tx.Exec(ctx, `INSERT INTO scope_seen SELECT $1, $2, current_setting('kumiko.tenant_id'), current_user,
			(SELECT count(*) FROM scope_seen)`, e.TenantID, e.Payload.N)
		return err
	})
	var systemSaw []int64
	system := dispatcher.Consumer{Name: "scope:system", System: true, Apply: func(ctx context.Context, tx *framework.Tx, env framework.Envelope) error {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM scope_seen`).Scan(&n); err != nil {
			return err
		}
		systemSaw = append(systemSaw, n)
		return nil
	}}
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	d, err := dispatcher.New(db.Pool, reg, append(dispatcher.ProjectionConsumers(reg, nil), system), &dispatcher.Config{InstanceID: "scope-test"})
	require.NoError(t, err)
	require.NoError(t, d.Register(ctx))

	// t1 t1 t2 (untouched) t2 t1 (untouched) t1 t2 ... in one pass.
	const n = 40
	for i := range n {
		tenant := []string{"t1", "t1", "t2", "t2", "t1"}[i%5]
		_, err := rt.InTx(ctx, tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: tenant}, framework.AnyVersion, ev.With(scopeNote{N: i, Touch: i%3 != 0}))
		})
		require.NoError(t, err)
	}
	deliver := func(name string) {
		got := 0
		deadline := time.Now().Add(30 * time.Second)
		for got < n {
			k, err := d.RunOnce(ctx, name)
			require.NoError(t, err)
			got += k
			if k == 0 {
				require.True(t, time.Now().Before(deadline), "%s delivered %d of %d", name, got, n)
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	deliver(p.Name())

	type seenRow struct {
		tenant, setting, role string
		n                     int
		visible               int64
	}
	rows, err := db.Pool.Query(ctx, `SELECT tenant_id, n, setting, role, visible FROM scope_seen ORDER BY n`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (seenRow, error) {
		var s seenRow
		err := r.Scan(&s.tenant, &s.n, &s.setting, &s.role, &s.visible)
		return s, err
	})
	require.NoError(t, err)
	seen := map[string]int64{}
	for _, r := range got {
		require.Equal(t, r.tenant, r.setting, "event %d", r.n)
		require.Equal(t, "kumiko_tenant", r.role, "event %d", r.n)
		require.Equal(t, seen[r.tenant], r.visible, "event %d of %s sees only its tenant's rows", r.n, r.tenant)
		seen[r.tenant]++
	}
	touched := len(got)
	want := 0
	for i := range n {
		if i%3 != 0 {
			want++
		}
	}
	require.Equal(t, want, touched)

	deliver("scope:system")
	require.Len(t, systemSaw, n)
	for _, v := range systemSaw {
		require.Equal(t, int64(touched), v, fmt.Sprintf("the system consumer sees every tenant: %v", systemSaw))
	}
}
