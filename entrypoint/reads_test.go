package entrypoint_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/cache"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
)

const readsSecret = "reads-test-secret-0123456789abcdef0123"

// readsApp builds and serves an App of mode with the orders feature.
func readsApp(t *testing.T, mode string, db *kumikotest.DB, env map[string]string) (*entrypoint.App, string) {
	t.Helper()
	return readsAppWith(t, mode, db, env, func(r *framework.Registry) { orders.Register(r) })
}

// readsAppWith builds and serves an App of mode with the features register
// declares.
func readsAppWith(t *testing.T, mode string, db *kumikotest.DB, env map[string]string, register func(*framework.Registry)) (*entrypoint.App, string) {
	t.Helper()
	vars := map[string]string{"APP_MODE": mode, "DATABASE_URL": db.URL, "JWT_SECRET": readsSecret,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "20", "HTTP_ADDR": "127.0.0.1:0", "WORKER_HTTP_ADDR": "127.0.0.1:0"}
	for k, v := range env {
		vars[k] = v
	}
	cfg, err := config.FromLookup(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	require.NoError(t, err)
	app, err := entrypoint.New(t.Context(), entrypoint.Options{Config: cfg, Register: register})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return app, "http://" + ln.Addr().String()
}

func readsToken(t *testing.T, tenant string) string {
	t.Helper()
	keys, err := config.ParseJWTKeys(readsSecret)
	require.NoError(t, err)
	ring, err := auth.NewKeyring([]auth.Key{{ID: keys[0].ID, Secret: keys[0].Secret}})
	require.NoError(t, err)
	tok, err := ring.Mint(auth.Principal{UserID: "alice", TenantID: tenant}, time.Hour)
	require.NoError(t, err)
	return tok
}

func readsPost(t *testing.T, url, tok string, body any, headers map[string]string) (int, http.Header, []byte) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, res.Header, out
}

func readsTenant() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "reads-" + hex.EncodeToString(b)
}

// TestReadsWiring: an all-in-one process makes keyed writes idempotent,
// serves orders:query:get from the cache, invalidates it from the log, and
// (with DATABASE_READ_URL) routes queries through the replica router.
func TestReadsWiring(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	app, url := readsApp(t, "all-in-one", db, map[string]string{"DATABASE_READ_URL": db.URL})
	require.Contains(t, app.Dispatcher().Consumers(), cache.ConsumerName)
	// The cache guard releases the cache once the invalidation consumer
	// registered.
	require.Eventually(t, func() bool { return metric(t, app, "kumiko_cache_held") == 0 }, 10*time.Second, 20*time.Millisecond)
	tenant := readsTenant()
	t.Cleanup(func() { // the process uses the default key prefixes
		ctx := context.Background()
		for _, pattern := range []string{"kumiko:idem:" + tenant + ":*", "kumiko:cache:" + tenant + ":*"} {
			keys, _ := app.Redis().Keys(ctx, pattern).Result()
			if len(keys) > 0 {
				app.Redis().Del(ctx, keys...)
			}
		}
	})
	tok := readsToken(t, tenant)

	place := map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 5}}
	key := map[string]string{web.HeaderIdempotencyKey: "wiring-1"}
	status, h1, first := readsPost(t, url+"/api/write", tok, place, key)
	require.Equal(t, http.StatusOK, status, "%s", first)
	status, h2, again := readsPost(t, url+"/api/write", tok, place, key)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, string(first), string(again))
	require.Equal(t, "true", h2.Get(web.HeaderIdempotentReplayed))
	token := h1.Get(web.HeaderConsistencyToken)
	require.True(t, framework.ValidConsistencyToken(token))

	var w struct{ Data orders.WriteResult }
	require.NoError(t, json.Unmarshal(first, &w))
	get := map[string]any{"type": "orders:query:get", "payload": map[string]any{"orderId": w.Data.ID}}
	status, _, body := readsPost(t, url+"/api/query", tok, get, map[string]string{web.HeaderConsistencyToken: token})
	require.Equal(t, http.StatusOK, status, "%s", body)
	for range 2 {
		status, _, body = readsPost(t, url+"/api/query", tok, get, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	require.GreaterOrEqual(t, metric(t, app, "kumiko_cache_hits_total"), 1.0)

	cancel := map[string]any{"type": "orders:write:cancel", "payload": map[string]any{"orderId": w.Data.ID, "expectedVersion": 1}}
	status, _, body = readsPost(t, url+"/api/write", tok, cancel, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.Eventually(t, func() bool {
		_, _, body := readsPost(t, url+"/api/query", tok, get, nil)
		return strings.Contains(string(body), `"status":"cancelled"`)
	}, 30*time.Second, 20*time.Millisecond, "the invalidation consumer drops the cached order")
	require.GreaterOrEqual(t, metric(t, app, "kumiko_cache_invalidations_total"), 1.0)
	require.GreaterOrEqual(t, metric(t, app, "kumiko_idempotency_replays_total"), 1.0)
}

// TestAPIModeRunsNoInvalidation: the api mode uses the cache but leaves
// the shared invalidation consumer to the workers; until a worker has
// registered it, the api's cache guard sends cached reads to the database
// (nothing would invalidate what they filled).
func TestAPIModeRunsNoInvalidation(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	app, url := readsApp(t, "api", db, nil)
	require.False(t, slices.Contains(app.Dispatcher().Consumers(), cache.ConsumerName))
	require.InDelta(t, 1, metric(t, app, "kumiko_cache_held"), 0)
	tok := readsToken(t, readsTenant())
	status, _, body := readsPost(t, url+"/api/write", tok,
		map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 5}}, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var w struct{ Data orders.WriteResult }
	require.NoError(t, json.Unmarshal(body, &w))
	get := map[string]any{"type": "orders:query:get", "payload": map[string]any{"orderId": w.Data.ID}}
	for range 2 {
		status, _, body = readsPost(t, url+"/api/query", tok, get, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	// Labelled counters show only once counted: absent is 0 here.
	all := metrics(t, app)
	require.InDelta(t, 0, all["kumiko_cache_hits_total"]+all["kumiko_cache_misses_total"], 0, "Redis was not asked")
	require.InDelta(t, 2, metric(t, app, "kumiko_cache_bypassed_total"), 0)

	worker, _ := readsApp(t, "worker", db, nil)
	require.Contains(t, worker.Dispatcher().Consumers(), cache.ConsumerName)
	require.Eventually(t, func() bool { return metric(t, app, "kumiko_cache_held") == 0 }, 10*time.Second, 20*time.Millisecond,
		"released once a worker registered the invalidation consumer")
}

func metrics(t *testing.T, app *entrypoint.App) map[string]float64 {
	t.Helper()
	mfs, err := app.Metrics().Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		total := 0.0
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
		out[mf.GetName()] = total
	}
	return out
}

// metric returns the process's metric name (summed over its labels); a
// name the process does not export fails the test, so that a renamed
// metric cannot pass an assertion of 0.
func metric(t *testing.T, app *entrypoint.App, name string) float64 {
	t.Helper()
	v, ok := metrics(t, app)[name]
	require.True(t, ok, "the process exports no metric %s", name)
	return v
}

// TestTTLOnlyCacheIsNotHeld: a registry whose cached queries name no
// invalidating event has no invalidation consumer, so no state row ever
// appears for the cache guard to read. Nothing can be held up, and the
// cache serves its entries for their TTL; the guard held it (every read
// went to the database) for the life of the process.
func TestTTLOnlyCacheIsNotHeld(t *testing.T) {
	t.Parallel()
	type in struct {
		ID string `json:"id" validate:"required"`
	}
	db := kumikotest.NewDB(t)
	app, url := readsAppWith(t, "all-in-one", db, nil, func(r *framework.Registry) {
		f := r.Feature("ttl-only")
		framework.Query(f, "echo", func(_ context.Context, _ *framework.Tx, in in) (in, error) { return in, nil },
			&framework.QueryOptions{Cache: framework.CacheBy(time.Minute, func(in in) string { return in.ID })})
	})
	require.NotContains(t, app.Dispatcher().Consumers(), cache.ConsumerName)
	tenant := readsTenant()
	t.Cleanup(func() {
		ctx := context.Background()
		keys, _ := app.Redis().Keys(ctx, "kumiko:cache:"+tenant+":*").Result()
		if len(keys) > 0 {
			app.Redis().Del(ctx, keys...)
		}
	})
	require.Eventually(t, func() bool { return metric(t, app, "kumiko_cache_held") == 0 }, 3*time.Second, 20*time.Millisecond,
		"no invalidation can be held up")
	tok := readsToken(t, tenant)
	echo := map[string]any{"type": "ttl-only:query:echo", "payload": map[string]any{"id": "a"}}
	for range 2 {
		status, _, body := readsPost(t, url+"/api/query", tok, echo, nil)
		require.Equal(t, http.StatusOK, status, "%s", body)
	}
	require.InDelta(t, 1, metric(t, app, "kumiko_cache_hits_total"), 0)
}

// TestWorkerGuardsItsCache: Go code in a worker (a job) that runs a cached
// query reads through the cache too, so the worker needs the guard that
// sends such reads to the database while the invalidations are held up;
// like an api process's, it holds the cache until it has read the
// invalidation consumer's state once, then lets it go.
func TestWorkerGuardsItsCache(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	vars := map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "20", "WORKER_HTTP_ADDR": "127.0.0.1:0"}
	cfg, err := config.FromLookup(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	require.NoError(t, err)
	app, err := entrypoint.New(t.Context(), entrypoint.Options{Config: cfg, Register: func(r *framework.Registry) { orders.Register(r) }})
	require.NoError(t, err)
	require.InDelta(t, 1, metric(t, app, "kumiko_cache_held"), 0, "held until the guard read the state")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { return metric(t, app, "kumiko_cache_held") == 0 }, 10*time.Second, 20*time.Millisecond,
		"released once the worker's invalidation consumer is registered")
}
