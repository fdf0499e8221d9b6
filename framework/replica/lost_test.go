package replica_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/replica"
	"github.com/kumiko-go/kumiko/internal/pgliveness"
)

// sleepInput asks the sleeper query to sleep on the standby, and also on
// the primary when OnPrimary is set.
type sleepInput struct {
	OnPrimary bool `json:"onPrimary"`
}

// TestLostReplicaConnectionRunsOnThePrimary stops and restarts the standby
// for real. A query whose replica connection the server ends before it
// produced its result (here while its statement runs: the pools check
// idle connections with pgliveness.ShouldPing, as the app's do, and that
// cannot see a connection ended after it was handed out) is read-only: it
// runs once more on the primary, counted as an error fallback, and the
// cooldown starts. The same goes for a pooled connection that the server
// ended between that check and the query (a pool that never pings stands
// for that window). A lost primary connection stays 503.
func TestLostReplicaConnectionRunsOnThePrimary(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx := t.Context()
	primary := openPool(t, c.primary.URL("kumiko"))
	newPool := func(ping func(context.Context, pgxpool.ShouldPingParams) bool) *pgxpool.Pool {
		pc, err := pgxpool.ParseConfig(c.standby.URL("kumiko"))
		require.NoError(t, err)
		pc.ShouldPing = ping
		p, err := pgxpool.NewWithConfig(ctx, pc)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		return p
	}
	live := newPool(pgliveness.ShouldPing)
	never := newPool(func(context.Context, pgxpool.ShouldPingParams) bool { return false })

	reg := framework.NewRegistry()
	framework.Query(reg.Feature("replica-test"), "sleeper", func(ctx context.Context, tx *framework.Tx, in sleepInput) (probe, error) {
		var p probe
		err := tx.QueryRow(ctx, `SELECT pg_is_in_recovery() FROM pg_sleep(CASE WHEN pg_is_in_recovery() OR $1 THEN 30 ELSE 0 END)`, in.OnPrimary).Scan(&p.InRecovery)
		return p, err
	}, nil)
	newRuntime := func(pool *pgxpool.Pool, cooldown time.Duration) (*framework.Runtime, *replica.Router) {
		router, err := replica.New(primary, pool, &replica.Config{Cooldown: cooldown})
		require.NoError(t, err)
		rt, err := framework.NewRuntime(reg, primary, &framework.RuntimeConfig{ReadPool: pool, ReadRouter: router})
		require.NoError(t, err)
		return rt, router
	}
	call := framework.Call{Principal: framework.Principal{UserID: "alice", TenantID: "acme"}}
	query := func(rt *framework.Runtime, onPrimary bool) (probe, error) {
		out, err := rt.Query(ctx, call, framework.Command{Type: "replica-test:query:sleeper",
			Payload: json.RawMessage(`{"onPrimary":` + map[bool]string{true: "true", false: "false"}[onPrimary] + `}`)})
		p, _ := out.(probe)
		return p, err
	}
	// running waits until the sleeper runs on the server at url.
	running := func(url string) {
		admin, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer func() { _ = admin.Close(context.Background()) }()
		require.Eventually(t, func() bool {
			var n int
			return admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(CASE%' AND pid <> pg_backend_pid()`).Scan(&n) == nil && n == 1
		}, 10*time.Second, 10*time.Millisecond)
	}
	type result struct {
		p   probe
		err error
	}
	async := func(rt *framework.Runtime, onPrimary bool) <-chan result {
		done := make(chan result, 1)
		go func() { p, err := query(rt, onPrimary); done <- result{p, err} }()
		return done
	}

	// 1. The standby stops while the query runs on it (fast shutdown:
	// FATAL 57P01 on its connection).
	rt, router := newRuntime(live, time.Minute)
	rtNever, routerNever := newRuntime(never, 200*time.Millisecond)
	warm, err := never.Acquire(ctx) // an idle pooled connection for step 3
	require.NoError(t, err)
	warm.Release()
	done := async(rt, false)
	running(c.standby.URL("kumiko"))
	c.standby.Stop()
	r := <-done
	require.NoError(t, r.err, "the query runs once more on the primary")
	require.False(t, r.p.InRecovery, "on the primary")
	require.InDelta(t, 1, router.Fallbacks(replica.ReasonError), 0)

	// 2. The standby is back (a restart): the cooldown has started, the
	// next query runs on the primary without trying it.
	c.standby = c.dir.StartOn(c.standby.DataDir, c.standby.Port, c.settings...)
	p, err := query(rt, false)
	require.NoError(t, err)
	require.False(t, p.InRecovery, "within the cooldown the query runs on the primary")
	require.InDelta(t, 2, router.Fallbacks(replica.ReasonError), 0)

	// 3. A pooled connection the restart ended, handed out unchecked.
	p, err = query(rtNever, false)
	require.NoError(t, err, "a dead pooled replica connection is no 503")
	require.False(t, p.InRecovery)
	require.InDelta(t, 1, routerNever.Fallbacks(replica.ReasonError), 0)
	// Past the cooldown the replica serves again; a statement it
	// cancels is the query's error, no lost connection and no fallback.
	time.Sleep(300 * time.Millisecond)
	done = async(rtNever, false)
	running(c.standby.URL("kumiko"))
	admin, err := pgx.Connect(ctx, c.standby.URL("kumiko"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(CASE%' AND pid <> pg_backend_pid()`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	r = <-done
	require.Error(t, r.err, "the cancelled statement fails the query")
	require.NotEqual(t, framework.CodeUnavailable, framework.ToError(r.err).Code, "%v", r.err)
	require.InDelta(t, 1, routerNever.Fallbacks(replica.ReasonError), 0, "a statement error of a live replica is no fallback")

	// 4. A lost primary connection is not retried: 503.
	done = async(rt, true)
	running(c.primary.URL("kumiko"))
	_, err = primary.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(CASE%' AND pid <> pg_backend_pid()`)
	require.NoError(t, err)
	r = <-done
	require.Error(t, r.err)
	require.Equal(t, framework.CodeUnavailable, framework.ToError(r.err).Code, "%v", r.err)
	require.InDelta(t, 3, router.Fallbacks(replica.ReasonError), 0, "counted once: for the cooldown, not for the lost primary connection")
}
