package web_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// idemBundle is a server with an idempotency store.
type idemBundle struct {
	*bundle
	store  *idempotency.Store
	prefix string
	// calls counts runs of the idem-test writes.
	calls *atomic.Int32
}

// idemOptions tune setupIdem.
type idemOptions struct {
	db     *kumikotest.DB // nil: a fresh one
	rdb    redis.UniversalClient
	prefix string
	lease  time.Duration
	// blockForever makes idem-test:write:block hang (the crash child).
	blockForever bool
	// gate, when set, holds the first run of idem-test:write:gated before
	// its first statement (of gated-locked: after it) until it is closed.
	gate chan struct{}
}

// idemPayload is the payload of the idem-test writes.
type idemPayload struct {
	Note string `json:"note"`
}

// setupIdem starts a server with the orders feature, an "idem-test" feature
// and an idempotency store on Redis under a prefix of its own.
func setupIdem(t *testing.T, o idemOptions) *idemBundle {
	t.Helper()
	if o.db == nil {
		o.db = kumikotest.NewDB(t)
	}
	if o.rdb == nil {
		o.rdb = redistest.Shared(t)
	}
	if o.prefix == "" {
		o.prefix = "kumiko-test:idem:" + randHex(6)
	}
	calls := &atomic.Int32{}
	reg := framework.NewRegistry()
	orders.Register(reg)
	f := reg.Feature("idem-test")
	noted := framework.DefineEvent[idemPayload](f, "noted", nil)
	framework.Write(f, "unavailable", func(_ context.Context, _ *framework.Tx, _ idemPayload) (any, error) {
		calls.Add(1)
		return nil, &framework.Error{Code: framework.CodeUnavailable, Message: "upstream down"}
	}, nil)
	framework.Write(f, "slow", func(ctx context.Context, tx *framework.Tx, in idemPayload) (map[string]string, error) {
		calls.Add(1)
		time.Sleep(300 * time.Millisecond)
		return map[string]string{"note": in.Note}, tx.Append(framework.Stream{Type: "note", ID: randHex(8)}, framework.NoStream, noted.With(in))
	}, nil)
	framework.Write(f, "block", func(ctx context.Context, tx *framework.Tx, in idemPayload) (map[string]string, error) {
		calls.Add(1)
		if o.blockForever {
			select {}
		}
		return map[string]string{"note": in.Note}, tx.Append(framework.Stream{Type: "note", ID: randHex(8)}, framework.NoStream, noted.With(in))
	}, nil)
	var gated atomic.Int32
	framework.Write(f, "gated", func(ctx context.Context, tx *framework.Tx, in idemPayload) (map[string]string, error) {
		calls.Add(1)
		if gated.Add(1) == 1 && o.gate != nil {
			<-o.gate
		}
		return map[string]string{"note": in.Note}, tx.Append(framework.Stream{Type: "note", ID: randHex(8)}, framework.NoStream, noted.With(in))
	}, nil)
	// gated-locked is gated after its first statement: it holds the key's
	// advisory lock (taken with BEGIN) while it waits.
	framework.Write(f, "gated-locked", func(ctx context.Context, tx *framework.Tx, in idemPayload) (map[string]string, error) {
		calls.Add(1)
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			return nil, err
		}
		if gated.Add(1) == 1 && o.gate != nil {
			<-o.gate
		}
		return map[string]string{"note": in.Note}, tx.Append(framework.Stream{Type: "note", ID: randHex(8)}, framework.NoStream, noted.With(in))
	}, nil)
	framework.Write(f, "panic", func(context.Context, *framework.Tx, idemPayload) (any, error) {
		calls.Add(1)
		panic("handler exploded")
	}, nil)
	// deadlock-once fails its first run with Postgres's deadlock error
	// (what the victim of a real deadlock gets), and appends afterwards.
	framework.Write(f, "deadlock-once", func(ctx context.Context, tx *framework.Tx, in idemPayload) (map[string]string, error) {
		if calls.Add(1) == 1 {
			if _, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$`); err != nil {
				return nil, err
			}
		}
		return map[string]string{"note": in.Note}, tx.Append(framework.Stream{Type: "note", ID: randHex(8)}, framework.NoStream, noted.With(in))
	}, nil)
	rt, err := framework.NewRuntime(reg, o.db.Pool, nil)
	require.NoError(t, err)
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret}})
	require.NoError(t, err)
	logs := &lockedBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	store, err := idempotency.New(o.rdb, &idempotency.Config{Prefix: o.prefix, TTL: 10 * time.Minute, Lease: o.lease, WaitTimeout: 15 * time.Second, Logger: logger})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, store.Close(context.Background())) }) // after the server closed
	s := web.New(rt, keys, &web.Config{Logger: logger, Idempotency: store})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &idemBundle{
		bundle: &bundle{db: o.db, url: srv.URL, client: srv.Client(), keys: keys, logs: logs},
		store:  store, prefix: o.prefix, calls: calls,
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tokenFor mints a token of user in tenant.
func (b *idemBundle) tokenFor(t *testing.T, tenant, user string) string {
	t.Helper()
	tok, err := b.keys.Mint(auth.Principal{UserID: user, TenantID: tenant}, time.Hour)
	require.NoError(t, err)
	return tok
}

// keyed posts body to path with an Idempotency-Key header ("" for none).
func (b *idemBundle) keyed(t *testing.T, path, token, key string, body any) response {
	t.Helper()
	h := map[string]string{}
	if key != "" {
		h[web.HeaderIdempotencyKey] = key
	}
	return b.do(t, request{path: path, token: token, body: body, headers: h})
}

// eventsWithKey counts the events whose metadata carries key.
func (b *idemBundle) eventsWithKey(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(t.Context(),
		`SELECT count(*) FROM events WHERE metadata->>'idempotencyKey' = $1`, key).Scan(&n))
	return n
}

// keyedMetadata returns the metadata of the one event whose metadata
// carries key.
func (b *idemBundle) keyedMetadata(t *testing.T, key string) framework.Metadata {
	t.Helper()
	var meta framework.Metadata
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT metadata FROM events WHERE metadata->>'idempotencyKey' = $1`, key).Scan(&meta))
	return meta
}

// recordOwner returns the owner of key's record in the shared Redis.
func (b *idemBundle) recordOwner(t *testing.T, tenant, user, key string) string {
	t.Helper()
	owner, err := redistest.Shared(t).HGet(t.Context(), b.prefix+":"+tenant+":"+user+":"+key, "owner").Result()
	require.NoError(t, err)
	return owner
}

func place(customer string) map[string]any {
	return map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": customer, "amountCents": 4200}}
}

func requireReplayOf(t *testing.T, first, again response) {
	t.Helper()
	require.Equal(t, first.status, again.status)
	require.Equal(t, string(first.body), string(again.body), "replayed byte for byte")
	require.Equal(t, "true", again.header.Get(web.HeaderIdempotentReplayed))
	require.Empty(t, first.header.Get(web.HeaderIdempotentReplayed))
	require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"))
	require.Equal(t, first.header.Get(web.HeaderConsistencyToken), again.header.Get(web.HeaderConsistencyToken))
	require.NotEqual(t, first.header.Get(web.HeaderRequestID), again.header.Get(web.HeaderRequestID), "the replay is its own request")
}

func TestIdempotentWriteReplaysSuccess(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	key := "order-" + randHex(8)

	first := b.keyed(t, "/api/write", tok, key, place("Ada"))
	var res orders.WriteResult
	first.requireData(t, &res)
	require.NotEmpty(t, first.header.Get(web.HeaderConsistencyToken))

	for range 2 {
		again := b.keyed(t, "/api/write", tok, key, place("Ada"))
		requireReplayOf(t, first, again)
	}
	// Key order and white space of the payload do not change the request.
	again := b.keyed(t, "/api/write", tok, key, `{"payload": {"amountCents": 4200, "customer": "Ada"}, "type": "orders:write:place"}`)
	requireReplayOf(t, first, again)

	require.Equal(t, 1, b.eventsWithKey(t, key), "the write ran once")
	b.requireRows(t, 1, 1)

	// The event names the key, the claim's owner and the request that ran it.
	meta := b.keyedMetadata(t, key)
	require.Equal(t, key, meta.IdempotencyKey)
	require.Equal(t, b.recordOwner(t, "acme", "alice", key), meta.IdempotencyOwner)
	require.Regexp(t, `^[0-9a-f]{32}$`, meta.IdempotencyOwner)
	require.Empty(t, meta.IdempotencyReclaimedFrom, "a fresh claim took over from no one")
	require.Equal(t, first.header.Get(web.HeaderRequestID), meta.RequestID)
	require.Equal(t, "alice", meta.UserID)
	replays := b.logs.lines(t, "idempotent replay")
	require.Len(t, replays, 3)
	require.Equal(t, key, replays[0]["idempotency_key"])
	claims := b.logs.lines(t, "idempotency key claimed")
	require.Len(t, claims, 1, "one owner")
	require.Equal(t, meta.RequestID, claims[0]["request_id"])
	require.NotEmpty(t, claims[0]["owner"])
}

func TestIdempotentWriteReplaysFailure(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	key := "cancel-" + randHex(8)
	cancel := map[string]any{"type": "orders:write:cancel", "payload": map[string]any{
		"orderId": "018f0000-0000-7000-8000-000000000000", "expectedVersion": 1}}

	first := b.keyed(t, "/api/write", tok, key, cancel)
	env := first.requireError(t, http.StatusNotFound, "not_found")
	again := b.keyed(t, "/api/write", tok, key, cancel)
	requireReplayOf(t, first, again)
	require.Contains(t, string(again.body), env.Error.RequestID, "the stored envelope names the first request")

	// A panic is an internal error, stored like any failure.
	pkey := "panic-" + randHex(8)
	boom := map[string]any{"type": "idem-test:write:panic", "payload": map[string]any{"note": "x"}}
	first = b.keyed(t, "/api/write", tok, pkey, boom)
	first.requireError(t, http.StatusInternalServerError, "internal")
	again = b.keyed(t, "/api/write", tok, pkey, boom)
	requireReplayOf(t, first, again)
	require.EqualValues(t, 1, b.calls.Load(), "the panicking handler ran once")
	b.requireRows(t, 0, 0)
}

// TestIdempotencyOnTheWire spells the header names and the body field as
// the issue and the README do, not through the package's constants: a
// batch that fails is stored and replayed byte for byte like a write, and
// a batch that succeeds answers its consistency token in the header and
// the body alike.
func TestIdempotencyOnTheWire(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	send := func(key string, body any) response {
		return b.do(t, request{path: "/api/batch", token: tok, body: body, headers: map[string]string{"Idempotency-Key": key}})
	}
	failing := map[string]any{"commands": []any{place("A"), place("")}}
	key := "wire-" + randHex(8)
	first := send(key, failing)
	env := first.requireError(t, http.StatusBadRequest, "validation_error")
	require.EqualValues(t, 1, env.Error.Details["index"])
	again := send(key, failing)
	require.Equal(t, first.status, again.status)
	require.Equal(t, string(first.body), string(again.body), "a failure is replayed byte for byte")
	require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
	require.Empty(t, first.header.Get("Idempotent-Replayed"))
	b.requireRows(t, 0, 0)

	ok := send("wire-ok-"+randHex(8), map[string]any{"commands": []any{place("A")}})
	require.Equal(t, http.StatusOK, ok.status, "%s", ok.body)
	var out struct {
		ConsistencyToken string `json:"consistencyToken"`
	}
	require.NoError(t, json.Unmarshal(ok.body, &out))
	require.True(t, framework.ValidConsistencyToken(out.ConsistencyToken), "body token %q", out.ConsistencyToken)
	require.Equal(t, out.ConsistencyToken, ok.header.Get("X-Kumiko-Consistency-Token"))
}

func TestIdempotencyKeyInBody(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	key := "body-" + randHex(8)
	withID := place("Grace")
	withID["requestId"] = key

	first := b.keyed(t, "/api/write", tok, "", withID)
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	requireReplayOf(t, first, b.keyed(t, "/api/write", tok, "", withID))
	// The header and the body naming the same key is one key.
	requireReplayOf(t, first, b.keyed(t, "/api/write", tok, key, withID))
	require.Equal(t, 1, b.eventsWithKey(t, key))

	// Different keys in header and body: 400, nothing runs.
	env := b.keyed(t, "/api/write", tok, "other-"+randHex(4), withID).requireError(t, http.StatusBadRequest, "bad_request")
	require.Contains(t, env.Error.Message, "differ")
	b.requireRows(t, 1, 1)
	// Two Idempotency-Key headers: 400, nothing runs (a proxy that
	// merges them into "a, b" makes an invalid key, a 400 too).
	env = b.do(t, request{path: "/api/write", token: tok, body: place("Grace"),
		added: http.Header{web.HeaderIdempotencyKey: {key, "other-" + randHex(4)}}}).requireError(t, http.StatusBadRequest, "bad_request")
	require.Contains(t, env.Error.Message, "one Idempotency-Key")
	b.requireRows(t, 1, 1)
	// A key given empty (header or body) is an invalid key, not "no key":
	// the client meant to be protected. 400, nothing runs.
	env = b.do(t, request{path: "/api/write", token: tok, body: place("Grace"),
		added: http.Header{web.HeaderIdempotencyKey: {""}}}).requireError(t, http.StatusBadRequest, "bad_request")
	require.Contains(t, env.Error.Message, "idempotency key must be 1 to")
	emptyID := place("Grace")
	emptyID["requestId"] = ""
	b.keyed(t, "/api/write", tok, "", emptyID).requireError(t, http.StatusBadRequest, "bad_request")
	b.requireRows(t, 1, 1)
	// An empty header beside a requestId is two keys that differ: 400,
	// as for any other header that is not the body's key.
	otherID := place("Grace")
	otherID["requestId"] = "body-" + randHex(8)
	env = b.do(t, request{path: "/api/write", token: tok, body: otherID,
		added: http.Header{web.HeaderIdempotencyKey: {""}}}).requireError(t, http.StatusBadRequest, "bad_request")
	require.Contains(t, env.Error.Message, "differ")
	b.requireRows(t, 1, 1)
	// A huge requestId is not echoed whole.
	huge := place("Grace")
	huge["requestId"] = strings.Repeat("r", 100_000)
	env = b.keyed(t, "/api/write", tok, key, huge).requireError(t, http.StatusBadRequest, "bad_request")
	shown, _ := env.Error.Details["requestId"].(string)
	require.Equal(t, strings.Repeat("r", idempotency.MaxKeyLength)+"...", shown)
	b.requireRows(t, 1, 1)

	// A batch with a requestId.
	batch := map[string]any{"requestId": "batch-" + key, "commands": []any{
		map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "A", "amountCents": 1}},
		map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "B", "amountCents": 2}},
	}}
	bf := b.keyed(t, "/api/batch", tok, "", batch)
	require.Equal(t, http.StatusOK, bf.status, "%s", bf.body)
	requireReplayOf(t, bf, b.keyed(t, "/api/batch", tok, "", batch))
	require.Equal(t, 2, b.eventsWithKey(t, "batch-"+key))
	b.requireRows(t, 3, 3)
}

func TestIdempotencyKeyReusedForADifferentRequest(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	key := "reuse-" + randHex(8)
	require.Equal(t, http.StatusOK, b.keyed(t, "/api/write", tok, key, place("Ada")).status)

	env := b.keyed(t, "/api/write", tok, key, place("Eve")).requireError(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	require.Equal(t, key, env.Error.Details["idempotencyKey"])
	// Another type with the same key, and the same key on another route.
	b.keyed(t, "/api/write", tok, key, map[string]any{"type": "idem-test:write:block", "payload": map[string]any{"note": "x"}}).
		requireError(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	b.keyed(t, "/api/batch", tok, key, map[string]any{"commands": []any{place("Ada")}}).
		requireError(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	require.Equal(t, 1, b.eventsWithKey(t, key))
	b.requireRows(t, 1, 1)
}

func TestIdempotencyIsScopedByTenantAndUser(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	key := "shared-" + randHex(8)
	ids := map[string]bool{}
	for _, who := range [][2]string{{"acme", "alice"}, {"acme", "bob"}, {"globex", "alice"}} {
		tok := b.tokenFor(t, who[0], who[1])
		r := b.keyed(t, "/api/write", tok, key, place("Ada"))
		require.Empty(t, r.header.Get(web.HeaderIdempotentReplayed), "%v must not get another caller's result", who)
		var res orders.WriteResult
		r.requireData(t, &res)
		ids[res.ID] = true
		requireReplayOf(t, r, b.keyed(t, "/api/write", tok, key, place("Ada")))
	}
	require.Len(t, ids, 3)
	require.Equal(t, 3, b.eventsWithKey(t, key))
}

func TestParallelDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	key := "parallel-" + randHex(8)
	body := map[string]any{"type": "idem-test:write:slow", "payload": map[string]any{"note": "once"}}
	const n = 12
	results := make([]response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = b.keyed(t, "/api/write", tok, key, body)
		})
	}
	close(start)
	wg.Wait()
	replayed := 0
	for i, r := range results {
		require.Equal(t, http.StatusOK, r.status, "request %d: %s", i, r.body)
		require.Equal(t, string(results[0].body), string(r.body))
		if r.header.Get(web.HeaderIdempotentReplayed) == "true" {
			replayed++
		}
	}
	require.Equal(t, n-1, replayed)
	require.EqualValues(t, 1, b.calls.Load(), "the handler ran once")
	require.Equal(t, 1, b.eventsWithKey(t, key), "one event: one execution")
}

func TestUnavailableIsNotStored(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	key := "transient-" + randHex(8)
	body := map[string]any{"type": "idem-test:write:unavailable", "payload": map[string]any{}}
	b.keyed(t, "/api/write", tok, key, body).requireError(t, http.StatusServiceUnavailable, "unavailable")
	r := b.keyed(t, "/api/write", tok, key, body)
	r.requireError(t, http.StatusServiceUnavailable, "unavailable")
	require.Empty(t, r.header.Get(web.HeaderIdempotentReplayed))
	require.EqualValues(t, 2, b.calls.Load(), "a retry after a 503 runs again")
	// A 503 is expected while a dependency is away: logged as a warning
	// with its cause, not as an "internal error".
	require.Empty(t, b.logs.lines(t, "internal error"))
	unavailable := b.logs.lines(t, "request failed")
	require.Len(t, unavailable, 2)
	require.Equal(t, "WARN", unavailable[0]["level"])
	require.Equal(t, "unavailable", unavailable[0]["code"])
	require.NotEmpty(t, unavailable[0]["error"])
}

// A write that lost a deadlock (or a serialization failure) committed
// nothing and is answered 409 "retry": that answer is not stored, so the
// retry with the same key runs instead of replaying the failure forever.
func TestTransientConflictIsNotStored(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	for _, path := range []string{"/api/write", "/api/batch"} {
		b.calls.Store(0)
		key := "deadlock-" + randHex(8)
		cmd := map[string]any{"type": "idem-test:write:deadlock-once", "payload": map[string]any{"note": "n"}}
		body := cmd
		if path == "/api/batch" {
			body = map[string]any{"commands": []any{place("Ada"), cmd}}
		}
		env := b.keyed(t, path, tok, key, body).requireError(t, http.StatusConflict, "conflict")
		require.Contains(t, env.Error.Message, "retry")
		r := b.keyed(t, path, tok, key, body)
		require.Equal(t, http.StatusOK, r.status, "%s: body: %s", path, r.body)
		require.Empty(t, r.header.Get(web.HeaderIdempotentReplayed), path)
		require.EqualValues(t, 2, b.calls.Load(), "%s: the retry ran again", path)
		// The retry's answer is stored like any other.
		r = b.keyed(t, path, tok, key, body)
		require.Equal(t, http.StatusOK, r.status, path)
		require.Equal(t, "true", r.header.Get(web.HeaderIdempotentReplayed), path)
		require.EqualValues(t, 2, b.calls.Load(), path)
	}
	require.Equal(t, 3, b.count(t, "events"))
}

func TestInvalidIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	for _, key := range []string{"has space", strings.Repeat("k", 256)} {
		b.keyed(t, "/api/write", tok, key, place("Ada")).requireError(t, http.StatusBadRequest, "bad_request")
	}
	bad := place("Ada")
	bad["requestId"] = "ünïcode"
	b.keyed(t, "/api/write", tok, "", bad).requireError(t, http.StatusBadRequest, "bad_request")
	b.requireRows(t, 0, 0)
	// A keyed request with a malformed body is the handler's 400, and
	// claims nothing.
	b.keyed(t, "/api/write", tok, "k-"+randHex(4), `{"type": "orders:write:place", "payload": {`).requireError(t, http.StatusBadRequest, "bad_request")
}

func TestIdempotencyRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	b := setupIdem(t, idemOptions{rdb: srv.Client()})
	tok := b.tokenFor(t, "acme", "alice")
	require.Equal(t, http.StatusOK, b.keyed(t, "/api/write", tok, "up-"+randHex(4), place("Before")).status)

	srv.Stop()
	key := "down-" + randHex(8)
	env := b.keyed(t, "/api/write", tok, key, place("Keyed")).requireError(t, http.StatusServiceUnavailable, "idempotency_unavailable")
	require.Contains(t, env.Error.Message, "not executed")
	b.keyed(t, "/api/batch", tok, key, map[string]any{"commands": []any{place("KeyedBatch")}}).
		requireError(t, http.StatusServiceUnavailable, "idempotency_unavailable")
	require.Equal(t, 0, b.eventsWithKey(t, key), "a keyed request does not run unprotected")
	var keyed int
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM orders WHERE customer LIKE 'Keyed%'`).Scan(&keyed))
	require.Zero(t, keyed)
	// Unkeyed writes go on.
	require.Equal(t, http.StatusOK, b.keyed(t, "/api/write", tok, "", place("Unkeyed")).status)

	srv.Start()
	first := b.keyed(t, "/api/write", tok, key, place("Keyed"))
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	requireReplayOf(t, first, b.keyed(t, "/api/write", tok, key, place("Keyed")))
	b.requireRows(t, 3, 3)
}

func TestWriteAnswersConsistencyToken(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	r := b.keyed(t, "/api/write", tok, "", place("Ada"))
	var body struct {
		Data             orders.WriteResult `json:"data"`
		ConsistencyToken string             `json:"consistencyToken"`
	}
	require.NoError(t, json.Unmarshal(r.body, &body))
	require.True(t, framework.ValidConsistencyToken(body.ConsistencyToken), "token %q", body.ConsistencyToken)
	require.Equal(t, body.ConsistencyToken, r.header.Get(web.HeaderConsistencyToken))
	require.NotEmpty(t, body.Data.ID)

	// The token comes back in a header or the body.
	get := map[string]any{"type": "orders:query:get", "payload": map[string]any{"orderId": body.Data.ID}}
	q := b.do(t, request{path: "/api/query", token: tok, body: get, headers: map[string]string{web.HeaderConsistencyToken: body.ConsistencyToken}})
	var o orders.Order
	q.requireData(t, &o)
	require.Equal(t, "Ada", o.Customer)
	get["consistencyToken"] = body.ConsistencyToken
	b.post(t, "/api/query", tok, get).requireData(t, &o)
	get["consistencyToken"] = "not-a-token"
	b.post(t, "/api/query", tok, get).requireError(t, http.StatusBadRequest, "bad_request")
	// Two token headers: which write the client meant to read is unknown.
	delete(get, "consistencyToken")
	b.do(t, request{path: "/api/query", token: tok, body: get,
		added: http.Header{web.HeaderConsistencyToken: {body.ConsistencyToken, body.ConsistencyToken}}}).
		requireError(t, http.StatusBadRequest, "bad_request")

	// A batch answers one token too.
	br := b.keyed(t, "/api/batch", tok, "", map[string]any{"commands": []any{place("B")}})
	require.Equal(t, http.StatusOK, br.status)
	require.True(t, framework.ValidConsistencyToken(br.header.Get(web.HeaderConsistencyToken)))
}

// The crash test: a child process (this test binary, re-executed) claims a
// key with a write that never ends and is killed with SIGKILL; the same
// request to another server waits for the dead owner's lease to run out,
// takes the key over and runs once.

const crashChildEnv = "KUMIKO_WEB_IDEM_CRASH_CHILD"

func TestIdempotencyCrashChild(t *testing.T) {
	spec := os.Getenv(crashChildEnv)
	if spec == "" {
		t.Skip("helper process of TestCrashedOwnerIsReclaimed")
	}
	var cfg struct{ DBURL, Prefix string }
	require.NoError(t, json.Unmarshal([]byte(spec), &cfg))
	pool := kumikotest.DB{URL: cfg.DBURL}
	p, err := newPool(t, cfg.DBURL)
	require.NoError(t, err)
	pool.Pool = p
	b := setupIdem(t, idemOptions{db: &pool, prefix: cfg.Prefix, lease: 600 * time.Millisecond, blockForever: true})
	fmt.Printf("LISTEN %s\n", b.url)
	select {} // until killed
}

func TestCrashedOwnerIsReclaimed(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	prefix := "kumiko-test:idem:" + randHex(6)
	spec, err := json.Marshal(map[string]string{"DBURL": db.URL, "Prefix": prefix})
	require.NoError(t, err)
	child := exec.Command(os.Args[0], "-test.run=^TestIdempotencyCrashChild$", "-test.count=1")
	child.Env = append(os.Environ(), crashChildEnv+"="+string(spec))
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	var childURL string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "LISTEN "); ok {
			childURL = u
			break
		}
	}
	require.NotEmpty(t, childURL, "child did not start")
	go func() { // drain
		for sc.Scan() {
		}
	}()

	b := setupIdem(t, idemOptions{db: db, prefix: prefix, lease: 600 * time.Millisecond})
	tok := b.tokenFor(t, "acme", "alice")
	key := "crash-" + randHex(8)
	body := map[string]any{"type": "idem-test:write:block", "payload": map[string]any{"note": "after crash"}}

	// The child claims the key; its handler hangs.
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, childURL+"/api/write",
			strings.NewReader(`{"type":"idem-test:write:block","payload":{"note":"after crash"}}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(web.HeaderIdempotencyKey, key)
		if res, err := http.DefaultClient.Do(req); err == nil {
			_ = res.Body.Close()
		}
	}()
	rdb := redistest.Shared(t)
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(t.Context(), prefix+":acme:alice:"+key).Result()
		return err == nil && n == 1
	}, 10*time.Second, 10*time.Millisecond, "child never claimed the key")
	deadOwner := b.recordOwner(t, "acme", "alice", key)
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	_ = child.Wait()

	start := time.Now()
	r := b.keyed(t, "/api/write", tok, key, body)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.Empty(t, r.header.Get(web.HeaderIdempotentReplayed), "the dead owner stored nothing: this request runs")
	require.Greater(t, time.Since(start), 100*time.Millisecond, "it waited for the lease")
	require.Equal(t, 1, b.eventsWithKey(t, key), "one execution (the dead one committed nothing)")
	requireReplayOf(t, r, b.keyed(t, "/api/write", tok, key, body))
	// The event names both owners: the one that ran it and the dead one.
	meta := b.keyedMetadata(t, key)
	require.Equal(t, b.recordOwner(t, "acme", "alice", key), meta.IdempotencyOwner)
	require.Equal(t, deadOwner, meta.IdempotencyReclaimedFrom)
	require.NotEqual(t, deadOwner, meta.IdempotencyOwner)
}

// newPool opens a pool on url, closed when the test ends.
func newPool(t *testing.T, url string) (*pgxpool.Pool, error) {
	t.Helper()
	p, err := pgxpool.New(t.Context(), url)
	if err != nil {
		return nil, err
	}
	t.Cleanup(p.Close)
	return p, nil
}

// Object keys that differ only in case are one field to the handler's
// decoder (the last one wins), so their order decides what runs: two
// payloads that differ only in that order are different requests, not a
// retry with the keys reordered. Semantically equal forms still replay.
func TestFingerprintKeepsTheOrderOfCaseVariantKeys(t *testing.T) {
	t.Parallel()
	b := setupIdem(t, idemOptions{})
	tok := b.tokenFor(t, "acme", "alice")
	key := "fold-" + randHex(8)
	first := b.keyed(t, "/api/write", tok, key, `{"type":"idem-test:write:block","payload":{"note":"a","Note":"b"}}`)
	require.Equal(t, http.StatusOK, first.status, "%s", first.body)
	require.Contains(t, string(first.body), `"note":"b"`)
	requireReplayOf(t, first, b.keyed(t, "/api/write", tok, key, `{"type": "idem-test:write:block", "payload": {"note": "a", "Note": "b"}}`))

	other := b.keyed(t, "/api/write", tok, key, `{"type":"idem-test:write:block","payload":{"Note":"b","note":"a"}}`)
	other.requireError(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
	require.EqualValues(t, 1, b.calls.Load())
}
