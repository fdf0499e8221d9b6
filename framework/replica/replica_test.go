package replica_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/framework/replica"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/pgcluster"
)

// cluster is a private primary with a streaming standby, both on loopback
// ports of their own, in a temporary directory.
type cluster struct {
	primary, standby *pgcluster.Server
	// dir and settings start a stopped server again.
	dir      *pgcluster.Dir
	settings []string
}

// newCluster initialises a primary, migrates a "kumiko" database on it,
// clones it with pg_basebackup -R -X stream and starts the clone as a hot
// standby streaming from the primary, with standbySettings on top.
func newCluster(t *testing.T, standbySettings ...string) *cluster {
	t.Helper()
	d := pgcluster.New(t)
	settings := []string{"wal_level=replica", "max_wal_senders=4", "hot_standby=on"}
	c := &cluster{primary: d.Start(d.InitDB("primary"), settings...), dir: d, settings: settings}

	admin, err := pgx.Connect(t.Context(), c.primary.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(t.Context(), `CREATE DATABASE kumiko`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(t.Context()))
	pool, err := pgxpool.New(t.Context(), c.primary.URL("kumiko"))
	require.NoError(t, err)
	_, err = migrate.Up(t.Context(), pool, nil, nil)
	pool.Close()
	require.NoError(t, err)

	standbyDir := filepath.Join(d.Path, "standby")
	d.Run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.primary.Port), "-U", "postgres",
		"-D", standbyDir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	c.standby = d.Start(standbyDir, append(settings[:len(settings):len(settings)], standbySettings...)...)
	return c
}

// probeInput and probe are the test query: does the order exist, and on
// which server did the query run?
type probeInput struct {
	OrderID string `json:"orderId" validate:"required,uuid"`
}

type probe struct {
	Found      bool `json:"found"`
	InRecovery bool `json:"inRecovery"`
}

// TestStreamingReplica runs queries on a real streaming standby and proves
// read-your-writes with the consistency token.
func TestStreamingReplica(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx := t.Context()
	primary := openPool(t, c.primary.URL("kumiko"))
	standby := openPool(t, c.standby.URL("kumiko"))
	var inRecovery bool
	require.NoError(t, standby.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery, "the clone is a standby")

	reg := framework.NewRegistry()
	orders.Register(reg)
	framework.Query(reg.Feature("replica-test"), "probe", func(ctx context.Context, tx *framework.Tx, in probeInput) (probe, error) {
		var p probe
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1), pg_is_in_recovery()`, in.OrderID).Scan(&p.Found, &p.InRecovery)
		return p, err
	}, nil)
	metrics := prometheus.NewRegistry()
	router, err := replica.New(primary, standby, &replica.Config{WaitTimeout: 400 * time.Millisecond, Metrics: metrics})
	require.NoError(t, err)
	rt, err := framework.NewRuntime(reg, primary, &framework.RuntimeConfig{ReadPool: standby, ReadRouter: router})
	require.NoError(t, err)
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	require.NoError(t, err)
	srv := httptest.NewServer(web.New(rt, keys, nil).Handler())
	t.Cleanup(srv.Close)
	tok, err := keys.Mint(auth.Principal{UserID: "alice", TenantID: "acme"}, time.Hour)
	require.NoError(t, err)

	post := func(path string, body any, token string) (int, http.Header, []byte) {
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(string(raw)))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set(web.HeaderConsistencyToken, token)
		}
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		buf, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, res.Header, buf
	}
	place := func(customer string) (id, token string) {
		status, h, body := post("/api/write", map[string]any{"type": "orders:write:place",
			"payload": map[string]any{"customer": customer, "amountCents": 1}}, "")
		require.Equal(t, http.StatusOK, status, "%s", body)
		var out struct {
			Data             orders.WriteResult `json:"data"`
			ConsistencyToken string             `json:"consistencyToken"`
		}
		require.NoError(t, json.Unmarshal(body, &out))
		require.Equal(t, out.ConsistencyToken, h.Get(web.HeaderConsistencyToken))
		return out.Data.ID, out.ConsistencyToken
	}
	query := func(id, token string) probe {
		status, _, body := post("/api/query", map[string]any{"type": "replica-test:query:probe", "payload": map[string]any{"orderId": id}}, token)
		require.Equal(t, http.StatusOK, status, "%s", body)
		var out struct{ Data probe }
		require.NoError(t, json.Unmarshal(body, &out))
		return out.Data
	}
	standbyAdmin, err := pgx.Connect(ctx, c.standby.URL("kumiko"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = standbyAdmin.Close(context.Background()) })

	// 1. Queries run on the replica, writes on the primary.
	id, token := place("Ada")
	require.True(t, framework.ValidConsistencyToken(token))
	p := query(id, token)
	require.True(t, p.Found, "a query with the token reads its write")
	require.Eventually(t, func() bool { p := query(id, ""); return p.Found && p.InRecovery }, 10*time.Second, 10*time.Millisecond,
		"a query without a token runs on the standby (pg_is_in_recovery) and sees the write once replayed")

	// 2. The replica falls behind (replay paused): without the token a
	// query misses the write; with it, it waits, then runs on the primary.
	_, err = standbyAdmin.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		return standbyAdmin.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state) == nil && state == "paused"
	}, 10*time.Second, 10*time.Millisecond)
	id2, token2 := place("Grace")
	p = query(id2, "")
	require.Equal(t, probe{Found: false, InRecovery: true}, p, "without the token the lagging replica does not show the write")
	start := time.Now()
	p = query(id2, token2)
	require.Equal(t, probe{Found: true, InRecovery: false}, p, "with the token the write is read, from the primary")
	require.GreaterOrEqual(t, time.Since(start), 350*time.Millisecond, "after waiting for the replica")
	require.InDelta(t, 1, router.Fallbacks(replica.ReasonLag), 0)
	requireMetric(t, metrics, "kumiko_replica_fallbacks_total", 1)

	// 3. The replica catches up while a token query waits: it is served by
	// the replica. (A later write makes sure WAL moves past the token.)
	type result struct {
		p   probe
		err error
	}
	done := make(chan result, 1)
	router2, err := replica.New(primary, standby, &replica.Config{WaitTimeout: 10 * time.Second})
	require.NoError(t, err)
	rt2, err := framework.NewRuntime(reg, primary, &framework.RuntimeConfig{ReadPool: standby, ReadRouter: router2})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		out, err := rt2.Query(ctx, framework.Call{Principal: framework.Principal{UserID: "alice", TenantID: "acme"}, ConsistencyToken: token2},
			framework.Command{Type: "replica-test:query:probe", Payload: json.RawMessage(`{"orderId":"` + id2 + `"}`)})
		pr, _ := out.(probe)
		done <- result{pr, err}
	})
	time.Sleep(200 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("the token query did not wait for the paused replica: %+v", r)
	default:
	}
	_, _ = place("Later")
	_, err = standbyAdmin.Exec(ctx, `SELECT pg_wal_replay_resume()`)
	require.NoError(t, err)
	wg.Wait()
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, probe{Found: true, InRecovery: true}, r.p, "served by the replica once it replayed past the token")
	require.Zero(t, router2.Fallbacks(replica.ReasonLag))

	// 4. A malformed token is the client's error.
	status, _, body := post("/api/query", map[string]any{"type": "replica-test:query:probe", "payload": map[string]any{"orderId": id}}, "0/XYZ")
	require.Equal(t, http.StatusBadRequest, status, "%s", body)
}

// TestPromotedReadServerIsCaughtUp promotes the standby, as a failover
// does, and reads from it with a token: pg_last_wal_replay_lsn() stays
// frozen where recovery ended, but a server out of recovery has every
// write, so the query runs on it at once, without waiting or falling back.
func TestPromotedReadServerIsCaughtUp(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx := t.Context()
	oldPrimary := openPool(t, c.primary.URL("kumiko"))
	promoted := openPool(t, c.standby.URL("kumiko"))
	var ok bool
	require.NoError(t, promoted.QueryRow(ctx, `SELECT pg_promote(true, 30)`).Scan(&ok))
	require.True(t, ok, "the standby is promoted")
	var inRecovery bool
	var replayed *string
	require.NoError(t, promoted.QueryRow(ctx, `SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text`).Scan(&inRecovery, &replayed))
	require.False(t, inRecovery)
	require.NotNil(t, replayed, "a promoted server keeps the position where its recovery ended")

	_, err := promoted.Exec(ctx, `CREATE TABLE after_failover (x int); INSERT INTO after_failover VALUES (1)`)
	require.NoError(t, err)
	var token string
	require.NoError(t, promoted.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&token))

	router, err := replica.New(oldPrimary, promoted, &replica.Config{Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	conn, err := router.AcquireRead(ctx, token)
	require.NoError(t, err)
	var port int
	err = conn.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port)
	conn.Release()
	require.NoError(t, err)
	require.Equal(t, c.standby.Port, port, "the query runs on the promoted read server")
	require.Zero(t, router.Fallbacks(replica.ReasonLag), "no wait for a replay that will never come")
}

func requireMetric(t *testing.T, reg *prometheus.Registry, name string, want float64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			total := 0.0
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
			require.InDelta(t, want, total, 0)
			return
		}
	}
	t.Fatalf("metric %s not registered", name)
}

// TestRouterRules uses the shared server as its own "replica" (not in
// recovery: always caught up) for the routing rules.
func TestRouterRules(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	_, err := replica.New(nil, db.Pool, nil)
	require.Error(t, err)
	router, err := replica.New(db.Pool, db.Pool, &replica.Config{Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	_, err = router.AcquireRead(t.Context(), "not a token")
	var fe *framework.Error
	require.True(t, errors.As(err, &fe))
	require.Equal(t, framework.CodeBadRequest, fe.Code)
	conn, err := router.AcquireRead(t.Context(), "FFFFFFFF/FFFFFFFF")
	require.NoError(t, err, "a server not in recovery counts as caught up")
	conn.Release()
	require.Zero(t, router.Fallbacks(replica.ReasonLag))

	// An unreachable replica: the primary answers, counted as an error
	// fallback.
	pc, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	var dials atomic.Int32
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	down, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(down.Close)
	router, err = replica.New(db.Pool, down, nil)
	require.NoError(t, err)
	for range 3 {
		conn, err = router.AcquireRead(t.Context(), "")
		require.NoError(t, err)
		var inRecovery bool
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
		conn.Release()
	}
	require.InDelta(t, 3, router.Fallbacks(replica.ReasonError), 0)
	require.EqualValues(t, 1, dials.Load(), "within the cooldown the replica is not tried again")
}

// TestHangingReplicaFallsBackWithinTheWait: a replica that takes the
// connection and the query and never answers (its backend stopped, as on a
// frozen host) must not hold a query with a consistency token beyond the
// bounded wait: it runs on the primary, counted as an error fallback, and
// the queries after it skip the replica for the cooldown.
func TestHangingReplicaFallsBackWithinTheWait(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	d := pgcluster.New(t)
	srv := d.Start(d.InitDB("hangs"))
	pc, err := pgxpool.ParseConfig(srv.URL("postgres"))
	require.NoError(t, err)
	pc.MaxConns = 1
	hung, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(hung.Close)
	var pid int
	require.NoError(t, hung.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pid))
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	const waitTimeout = 300 * time.Millisecond
	router, err := replica.New(db.Pool, hung, &replica.Config{WaitTimeout: waitTimeout, Cooldown: time.Minute})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for _, token := range []string{"0/1", ""} {
		start := time.Now()
		conn, err := router.AcquireRead(ctx, token)
		require.NoError(t, err, "token %q: the primary answers", token)
		took := time.Since(start)
		var port int
		err = conn.QueryRow(ctx, `SELECT inet_server_port()`).Scan(&port)
		conn.Release()
		require.NoError(t, err)
		require.NotEqual(t, srv.Port, port, "token %q: the query runs on the primary", token)
		require.Less(t, took, 4*waitTimeout, "token %q: the wait is bounded", token)
	}
	require.InDelta(t, 2, router.Fallbacks(replica.ReasonError), 0)
	require.Zero(t, router.Fallbacks(replica.ReasonLag))
}

// TestBusyReplicaPoolIsNoReplicaFailure: a token query that finds every
// replica connection in use by other queries runs on the primary once the
// bounded wait has passed, but a busy pool is no failure of the replica:
// it counts as a lag fallback, and the queries after it still use the
// replica. The deadline bounding a hung replica also bounded the wait for
// a free connection of a healthy one, and opened the cooldown for it:
// under load, every read went to the primary for a second at a time.
func TestBusyReplicaPoolIsNoReplicaFailure(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	pc, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	pc.MaxConns = 1
	busy, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(busy.Close)
	router, err := replica.New(db.Pool, busy, &replica.Config{WaitTimeout: 100 * time.Millisecond, Cooldown: time.Minute})
	require.NoError(t, err)
	held, err := busy.Acquire(t.Context())
	require.NoError(t, err)
	conn, err := router.AcquireRead(t.Context(), "0/1")
	held.Release()
	require.NoError(t, err, "the primary answers")
	conn.Release()
	require.Zero(t, router.Fallbacks(replica.ReasonError))
	require.InDelta(t, 1, router.Fallbacks(replica.ReasonLag), 0)

	conn, err = router.AcquireRead(t.Context(), "")
	require.NoError(t, err)
	onReplica := busy.Stat().AcquiredConns() == 1
	conn.Release()
	require.True(t, onReplica, "no cooldown: the replica serves the next query")
	require.Zero(t, router.Fallbacks(replica.ReasonError))
}

// openPool opens a pool on url, closed when the test ends.
func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
