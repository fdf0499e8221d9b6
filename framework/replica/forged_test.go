package replica_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/cache"
	"github.com/kumiko-go/kumiko/framework/replica"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// replicaAPI is an HTTP server whose queries run on a real standby through
// a replica router.
type replicaAPI struct {
	t                *testing.T
	primary, standby *pgxpool.Pool
	router           *replica.Router
	srv              *httptest.Server
	jwt              string
}

// newReplicaAPI serves the orders feature and the probe query over c, with
// a standby pool of standbyConns connections, and the query cache store
// (none for nil).
func newReplicaAPI(t *testing.T, c *cluster, standbyConns int32, cfg *replica.Config, store framework.QueryCacheStore) *replicaAPI {
	t.Helper()
	a := &replicaAPI{t: t, primary: openPool(t, c.primary.URL("kumiko"))}
	pc, err := pgxpool.ParseConfig(c.standby.URL("kumiko"))
	require.NoError(t, err)
	pc.MaxConns = standbyConns
	a.standby, err = pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	t.Cleanup(a.standby.Close)

	reg := framework.NewRegistry()
	orders.Register(reg)
	framework.Query(reg.Feature("replica-test"), "probe", func(ctx context.Context, tx *framework.Tx, in probeInput) (probe, error) {
		var p probe
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1), pg_is_in_recovery()`, in.OrderID).Scan(&p.Found, &p.InRecovery)
		return p, err
	}, nil)
	cfg.Metrics = prometheus.NewRegistry()
	a.router, err = replica.New(a.primary, a.standby, cfg)
	require.NoError(t, err)
	rt, err := framework.NewRuntime(reg, a.primary, &framework.RuntimeConfig{ReadPool: a.standby, ReadRouter: a.router, QueryCache: store})
	require.NoError(t, err)
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	require.NoError(t, err)
	a.srv = httptest.NewServer(web.New(rt, keys, nil).Handler())
	t.Cleanup(a.srv.Close)
	a.jwt, err = keys.Mint(auth.Principal{UserID: "alice", TenantID: "acme"}, time.Hour)
	require.NoError(t, err)
	return a
}

// post sends body to path with the consistency token (none for "") and
// returns the status and body. It is safe from several goroutines.
func (a *replicaAPI) post(ctx context.Context, path string, body any, token string) (int, []byte, error) {
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.srv.URL+path, strings.NewReader(string(raw)))
	req.Header.Set("Authorization", "Bearer "+a.jwt)
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(web.HeaderConsistencyToken, token)
	}
	res, err := a.srv.Client().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	buf, err := io.ReadAll(res.Body)
	return res.StatusCode, buf, err
}

// place writes an order and returns its id and consistency token.
func (a *replicaAPI) place(customer string) (id, token string) {
	status, body, err := a.post(a.t.Context(), "/api/write", map[string]any{"type": "orders:write:place",
		"payload": map[string]any{"customer": customer, "amountCents": 1}}, "")
	require.NoError(a.t, err)
	require.Equal(a.t, http.StatusOK, status, "%s", body)
	var out struct {
		Data             orders.WriteResult `json:"data"`
		ConsistencyToken string             `json:"consistencyToken"`
	}
	require.NoError(a.t, json.Unmarshal(body, &out))
	return out.Data.ID, out.ConsistencyToken
}

// probe runs the probe query for id with token.
func (a *replicaAPI) probe(ctx context.Context, id, token string) (int, []byte, error) {
	return a.post(ctx, "/api/query", map[string]any{"type": "replica-test:query:probe", "payload": map[string]any{"orderId": id}}, token)
}

// TestForgedFutureTokenIsRefused: a consistency token beyond the primary's
// WAL insert position did not come from a write of this database (every
// token is that position right after a commit, and it only grows): no
// replica will replay past it until the primary has written that much WAL.
// It used to wait the whole bound for the replica, holding a replica
// connection all along, and then run on the primary, so a few clients
// sending a made-up token (FFFFFFFF/FFFFFFFF) held the whole read pool
// and every other query waited for them. It is the client's error, 400
// bad_request, answered without the wait.
func TestForgedFutureTokenIsRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	const wait = 2 * time.Second
	a := newReplicaAPI(t, c, 2, &replica.Config{WaitTimeout: wait}, nil)
	ctx := t.Context()
	id, token := a.place("Ada")
	require.Eventually(t, func() bool {
		status, _, err := a.probe(ctx, id, token)
		return err == nil && status == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)

	var current string
	require.NoError(t, a.primary.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&current))
	var hi, lo uint32
	_, err := fmt.Sscanf(current, "%X/%X", &hi, &lo)
	require.NoError(t, err)
	// 1 GiB ahead of the primary: plausible-looking, and still made up.
	ahead := uint64(hi)<<32 | uint64(lo) + 1<<30
	forged := []string{"FFFFFFFF/FFFFFFFF", fmt.Sprintf("%X/%X", ahead>>32, uint32(ahead))}

	// Four forged queries at once against a replica pool of two, and an
	// honest query without a token beside them.
	type answer struct {
		status int
		body   []byte
		took   time.Duration
		err    error
	}
	answers := make([]answer, 4)
	var wg sync.WaitGroup
	baseline := a.standby.Stat().AcquireCount()
	for i := range answers {
		wg.Go(func() {
			start := time.Now()
			status, body, err := a.probe(ctx, id, forged[i%len(forged)])
			answers[i] = answer{status, body, time.Since(start), err}
		})
	}
	require.Eventually(t, func() bool { return a.standby.Stat().AcquireCount() > baseline }, 10*time.Second, time.Millisecond,
		"the forged queries reach the replica")
	start := time.Now()
	status, body, err := a.probe(ctx, id, "")
	honest := time.Since(start)
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	t.Logf("honest query beside 4 forged ones on a replica pool of 2: %v", honest)
	for i, ans := range answers {
		t.Logf("forged token %s: %d in %v", forged[i%len(forged)], ans.status, ans.took)
	}
	require.Less(t, honest, wait/2, "an honest query does not wait for forged tokens")
	for _, ans := range answers {
		require.NoError(t, ans.err)
		require.Equal(t, http.StatusBadRequest, ans.status, "%s", ans.body)
		var env struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(ans.body, &env))
		require.Equal(t, string(framework.CodeBadRequest), env.Error.Code)
		require.Contains(t, env.Error.Message, "ahead of the database")
		require.Less(t, ans.took, wait/2, "refused without the wait")
	}
	require.Zero(t, a.router.Fallbacks(replica.ReasonLag), "a refused query runs nowhere")

	// The primary's own position is a token a write can have answered: it
	// is served at once.
	require.NoError(t, a.primary.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&current))
	status, body, err = a.probe(ctx, id, current)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
}

// TestCacheStampAheadOfThePrimary: a cached query's reload after an
// invalidation reads at or after the invalidation's stamp, which the
// router checks like a client's token. A stamp ahead of the primary (read
// on a primary whose last WAL a failover lost, or before a restore) is no
// client's error: the query is answered from the primary, not 400.
func TestCacheStampAheadOfThePrimary(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	store, err := cache.New(redistest.Shared(t), &cache.Config{Prefix: "kumiko-test:" + uuid.NewString()})
	require.NoError(t, err)
	a := newReplicaAPI(t, c, 2, &replica.Config{WaitTimeout: 2 * time.Second}, store)
	ctx := t.Context()
	id, _ := a.place("Ada")
	require.NoError(t, store.Invalidate(ctx, "acme", "orders:query:get", id, "FFFFFFFF/FFFFFFFF", time.Minute))

	start := time.Now()
	status, body, err := a.post(ctx, "/api/query", map[string]any{"type": "orders:query:get", "payload": map[string]any{"orderId": id}}, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Contains(t, string(body), `"customer":"Ada"`, "the primary has the order")
	require.Less(t, time.Since(start), time.Second, "without waiting for the replica")
}

// TestWaitingTokenQueryHoldsNoReplicaConnection: a query whose token the
// lagging replica has not replayed yet waits for it, but not on a replica
// connection: it used to hold one for the whole wait, so while the
// replica lagged, every query with a token kept a connection of the read
// pool busy for up to WaitTimeout and the queries without one waited
// behind them. Between its checks it holds none; it is still served by the
// replica, checked on the connection it runs on, once that replayed past
// the token.
func TestWaitingTokenQueryHoldsNoReplicaConnection(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	a := newReplicaAPI(t, c, 1, &replica.Config{WaitTimeout: 20 * time.Second}, nil)
	ctx := t.Context()
	id, token := a.place("Ada")
	require.Eventually(t, func() bool {
		status, body, err := a.probe(ctx, id, token)
		return err == nil && status == http.StatusOK && strings.Contains(string(body), `"inRecovery":true`)
	}, 10*time.Second, 10*time.Millisecond)

	_, err := a.standby.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		return a.standby.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state) == nil && state == "paused"
	}, 10*time.Second, 10*time.Millisecond)
	id2, token2 := a.place("Grace")

	type answer struct {
		status int
		body   []byte
		err    error
	}
	waiting := make(chan answer, 1)
	baseline := a.standby.Stat().AcquireCount()
	go func() {
		status, body, err := a.probe(ctx, id2, token2)
		waiting <- answer{status, body, err}
	}()
	require.Eventually(t, func() bool { return a.standby.Stat().AcquireCount() > baseline }, 10*time.Second, time.Millisecond,
		"the token query checks the replica")

	// The only replica connection is free for a query without a token.
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	status, body, err := a.probe(qctx, id, "")
	took := time.Since(start)
	require.NoError(t, err, "a query without a token is not held up by the waiting one")
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Contains(t, string(body), `"inRecovery":true`, "on the replica: %s", body)
	t.Logf("query without a token beside a waiting token query, replica pool of 1: %v", took)
	select {
	case ans := <-waiting:
		t.Fatalf("the token query did not wait for the paused replica: %d %s %v", ans.status, ans.body, ans.err)
	default:
	}

	_, _ = a.place("Later") // moves WAL past the token
	admin := openPool(t, c.standby.URL("kumiko"))
	_, err = admin.Exec(ctx, `SELECT pg_wal_replay_resume()`)
	require.NoError(t, err)
	ans := <-waiting
	require.NoError(t, ans.err)
	require.Equal(t, http.StatusOK, ans.status, "%s", ans.body)
	require.Contains(t, string(ans.body), `"found":true,"inRecovery":true`, "served by the replica once it replayed past the token")
	require.Zero(t, a.router.Fallbacks(replica.ReasonLag))
}
