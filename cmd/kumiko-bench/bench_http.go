package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/web"
)

func init() { register(Bench{Name: "http-write", Run: benchHTTPWrite}) }

// httpWorkers is the number of concurrent HTTP clients.
const httpWorkers = 16

// benchOrderSQL is the baseline's business row, the one orders:write:place
// inserts.
const benchOrderSQL = `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ($1, $2, $3, $4)`

// serveHTTP serves h on a loopback port until the returned stop is called.
func serveHTTP(ctx context.Context, h http.Handler) (url string, stop func(), err error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := benchHTTPServer(h)
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// benchHTTPServer is the server of every HTTP benchmark, the framework's
// and the baselines': kumiko serve's, with the default HTTP_READ_TIMEOUT_MS
// and HTTP_IDLE_TIMEOUT_MS.
func benchHTTPServer(h http.Handler) *http.Server {
	return web.NewHTTPServer("", h, 30*time.Second, 2*time.Minute)
}

// postOK posts body to path as worker w of lc and fails on anything but
// 200.
func postOK(ctx context.Context, lc *loadClient, w int, path string, body []byte, headers ...header) error {
	status, resp, err := lc.post(ctx, w, path, body, headers...)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("POST %s: %d %s", path, status, resp)
	}
	return nil
}

// rawPlace is the baseline: the order row and its event in a raw pgx
// transaction.
func rawPlace(ctx context.Context, pool *pgxpool.Pool, tenant, eventType string) error {
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	ids := id.String()
	return rawTwoStatementTx(ctx, pool, tenant, benchOrderSQL, []any{tenant, ids, "acme", int64(1250)},
		orders.StreamType, ids, eventType, orders.Placed{OrderID: ids, Customer: "acme", AmountCents: 1250})
}

// rawFrameworkPlace is rawPlace with the framework's SQL (tenant scope,
// gapless append, consistency token) and its metadata.
func rawFrameworkPlace(ctx context.Context, pool *pgxpool.Pool, tenant, user, eventType string) error {
	id, err := uuid.NewV7()
	if err != nil {
		return err
	}
	ids, rid := id.String(), uuid.NewString()
	return rawFrameworkSQL(ctx, pool, tenant, benchOrderSQL, []any{tenant, ids, "acme", int64(1250)},
		eventstore.StreamRef{TenantID: tenant, Type: orders.StreamType, ID: ids},
		eventType, orders.Placed{OrderID: ids, Customer: "acme", AmountCents: 1250},
		eventstore.Metadata{UserID: user, RequestID: rid, CorrelationID: rid}, true)
}

// benchHTTPWrite: POST /api/write of orders:write:place through the real
// web server (HTTP keep-alive clients, JWT verification, JSON decoding and
// validation, the runtime) against raw pgx inserting the same order row and
// event row per transaction, at 16 concurrent clients. For reference it
// also serves the raw pgx transaction behind a bare net/http handler (no
// framework) to the same clients: the share of HTTP itself on this machine;
// and the framework's SQL sent by raw pgx behind that bare handler: the
// share of the framework's Go code.
func benchHTTPWrite(ctx context.Context, env *Env) ([]Result, error) {
	_, pool, drop, err := evDB(ctx, httpWorkers)
	if err != nil {
		return nil, err
	}
	defer drop()
	reg := framework.NewRegistry()
	ft := orders.Register(reg)
	rt, err := framework.NewRuntime(reg, pool, nil)
	if err != nil {
		return nil, err
	}
	keys, err := auth.NewKeyring([]auth.Key{{ID: "bench", Secret: []byte("bench-secret-0123456789abcdef0123")}})
	if err != nil {
		return nil, err
	}
	fwURL, stopFW, err := serveHTTP(ctx, web.New(rt, keys, nil).Handler())
	if err != nil {
		return nil, err
	}
	defer stopFW()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /raw", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := rawPlace(r.Context(), pool, "tenant-0", ft.Placed.Name()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"data":{"id":"00000000-0000-0000-0000-000000000000","version":1}}`))
	})
	mux.HandleFunc("POST /raw-framework-sql", func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The client sends its tenant and user as a query string.
		q := r.URL.Query()
		if err := rawFrameworkPlace(r.Context(), pool, q.Get("tenant"), q.Get("user"), ft.Placed.Name()); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"data":{"id":"00000000-0000-0000-0000-000000000000","version":1}}`))
	})
	rawURL, stopRaw, err := serveHTTP(ctx, mux)
	if err != nil {
		return nil, err
	}
	defer stopRaw()
	fwClient := newLoadClient(strings.TrimPrefix(fwURL, "http://"), httpWorkers)
	defer fwClient.close()
	rawClient := newLoadClient(strings.TrimPrefix(rawURL, "http://"), httpWorkers)
	defer rawClient.close()

	tokens := make([]string, httpWorkers)
	tenants := make([]string, httpWorkers)
	for w := range tokens {
		tenants[w] = "tenant-" + strconv.Itoa(w%4)
		if tokens[w], err = keys.Mint(auth.Principal{UserID: "bench-" + strconv.Itoa(w), TenantID: tenants[w]}, time.Hour); err != nil {
			return nil, err
		}
	}
	body := []byte(`{"type":"orders:write:place","payload":{"customer":"acme","amountCents":1250}}`)
	auths := make([]header, httpWorkers)
	for w, tok := range tokens {
		auths[w] = header{"Authorization", "Bearer " + tok}
	}
	fw := func(ctx context.Context, w int) error {
		return postOK(ctx, fwClient, w, "/api/write", body, auths[w])
	}
	base := func(ctx context.Context, w int) error { return rawPlace(ctx, pool, tenants[w], ft.Placed.Name()) }
	rawHTTP := func(ctx context.Context, w int) error { return postOK(ctx, rawClient, w, "/raw", body) }
	rawSQLPaths := make([]string, httpWorkers)
	for w := range rawSQLPaths {
		rawSQLPaths[w] = "/raw-framework-sql?tenant=" + tenants[w] + "&user=bench-" + strconv.Itoa(w)
	}
	rawSQLHTTP := func(ctx context.Context, w int) error { return postOK(ctx, rawClient, w, rawSQLPaths[w], body) }

	sliceDur, n := 1200*time.Millisecond, 12
	if env.Quick {
		sliceDur, n = 400*time.Millisecond, 2
	}
	ops := []func(context.Context, int) error{fw, base, rawHTTP, rawSQLHTTP}
	var written int64 // operations counted, each one row and one event
	for _, op := range ops {
		k, err := evRun(ctx, httpWorkers, sliceDur, op)
		if err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		written += k
	}
	side := func(name string, op func(context.Context, int) error) evSide {
		return evSide{name: name, run: func() (int64, error) { return evRun(ctx, httpWorkers, sliceDur, op) }}
	}
	totals, err := evCompare("http-write, 16 clients", newEvMeter(ctx, pool), n,
		side("POST /api/write orders:write:place", fw),
		side("baseline: raw pgx BEGIN; 2 INSERTs; COMMIT", base),
		side("(the baseline behind a bare net/http handler)", rawHTTP),
		side("(the framework's SQL behind bare net/http)", rawSQLHTTP))
	if err != nil {
		return nil, err
	}
	for _, t := range totals {
		written += t.ops
	}
	if err := evVerifyWrites(ctx, pool, "orders", written); err != nil {
		return nil, err
	}
	const baseline = "raw pgx BEGIN; 2 INSERTs; COMMIT"
	return []Result{
		ratioResult("POST /api/write orders:write:place, 16 HTTP clients", "req/s", totals[0].rate(), baseline, totals[1].rate(), 0.70),
		referenceResult("(reference) the baseline behind bare net/http, 16 HTTP clients", "req/s", totals[2].rate(), baseline, totals[1].rate()),
		referenceResult("(reference) the framework's SQL behind bare net/http, 16 HTTP clients", "req/s", totals[3].rate(), baseline, totals[1].rate()),
	}, nil
}
