package entrypoint_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// The fuzz targets of this file drive the sample app's HTTP handler
// in-process (an API process with every sample feature, on its own database
// and Redis) with what a client controls, and hold it to: no 5xx, a 4xx
// answers the error envelope, and a 4xx leaves no row and no event behind.
// Their seeds run as ordinary tests; `go test -fuzz FuzzHTTPWrite
// -fuzztime 2m -parallel 1 ./entrypoint` explores further.

// fuzzApp is one API process of the sample features, served in-process.
type fuzzApp struct {
	app  *entrypoint.App
	h    http.Handler
	db   *kumikotest.DB
	ring *auth.Keyring
	// user is a token of tenant "fuzz-a" (no roles), admin one of the same
	// tenant with the admin role.
	user, admin string
	// logs holds the process's logs: a failure shows the last of them.
	logs *fuzzLogs
	// orderID is an order of tenant "fuzz-a" (version 1), cursor an SSE id
	// of its event.
	orderID string
}

func newFuzzApp(t testing.TB) *fuzzApp {
	t.Helper()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg, err := config.FromLookup(func(k string) (string, bool) {
		v, ok := map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL, "JWT_SECRET": jwtSecret}[k]
		return v, ok
	})
	require.NoError(t, err)
	logs := &fuzzLogs{}
	app, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: features.Register, Routes: features.Routes,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	ring, err := auth.NewKeyring([]auth.Key{{Secret: []byte(jwtSecret)}})
	require.NoError(t, err)
	fa := &fuzzApp{app: app, h: app.Web().Handler(), db: db, ring: ring, logs: logs}
	fa.user = fa.mint(t, auth.Principal{UserID: "u1", TenantID: "fuzz-a"})
	fa.admin = fa.mint(t, auth.Principal{UserID: "root", TenantID: "fuzz-a", Roles: []string{"admin"}})
	// Serve mounts the jobs admin routes: no request before it has (echo
	// sizes a pooled context's path parameters by the routes it has seen).
	deadline := time.Now().Add(30 * time.Second)
	for app.State() != entrypoint.StateReady {
		require.True(t, time.Now().Before(deadline), "not serving")
		time.Sleep(5 * time.Millisecond)
	}
	for {
		rec := fa.serve(t, http.MethodGet, "/health/ready", nil, nil, time.Second)
		if rec.Code == http.StatusOK {
			break
		}
		require.True(t, time.Now().Before(deadline), "not ready: %s", rec.Body)
		time.Sleep(20 * time.Millisecond)
	}
	rec := fa.serve(t, http.MethodPost, "/api/write", []byte(`{"type":"orders:write:place","payload":{"customer":"c","amountCents":1}}`),
		http.Header{"Authorization": {"Bearer " + fa.user}, "Content-Type": {"application/json"}}, 0)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	var out struct {
		Data struct{ ID string } `json:"data"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out))
	fa.orderID = out.Data.ID
	return fa
}

func (fa *fuzzApp) mint(t testing.TB, p auth.Principal) string {
	t.Helper()
	tok, err := fa.ring.Mint(p, time.Hour)
	require.NoError(t, err)
	return tok
}

// serve runs one request through the handler; a positive limit cancels its
// context after that long (for the event stream).
func (fa *fuzzApp) serve(t testing.TB, method, target string, body []byte, h http.Header, limit time.Duration) *httptest.ResponseRecorder {
	t.Helper()
	ctx := context.Background()
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	req := httptest.NewRequestWithContext(ctx, method, "/", bytes.NewReader(body))
	// target may be anything a client sends on the request line.
	req.RequestURI = target
	u, err := req.URL.Parse(target)
	if err != nil {
		return nil
	}
	req.URL = u
	for k, vs := range h {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	rec := httptest.NewRecorder()
	fa.h.ServeHTTP(rec, req)
	return rec
}

// fuzzLogs is a log sink for the process's goroutines.
type fuzzLogs struct {
	mu  sync.Mutex
	buf []byte
}

func (b *fuzzLogs) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 1<<20 {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-1<<19:]...)
	}
	return len(p), nil
}

// tail returns the last n bytes written.
func (b *fuzzLogs) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf[max(0, len(b.buf)-n):])
}

// counts are the rows a request may leave behind.
type counts struct{ events, streams, orders, users int64 }

func (fa *fuzzApp) counts(t testing.TB) counts {
	t.Helper()
	var c counts
	require.NoError(t, fa.db.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM events), (SELECT count(*) FROM streams),
		(SELECT count(*) FROM orders), (SELECT count(*) FROM users)`).Scan(&c.events, &c.streams, &c.orders, &c.users))
	return c
}

// check holds a finished request to the invariants: no 5xx; a 4xx is the
// error envelope with its status and a request id, and changed nothing.
func (fa *fuzzApp) check(t *testing.T, what string, rec *httptest.ResponseRecorder, before counts) {
	t.Helper()
	if rec.Code >= 500 {
		t.Fatalf("%s: %d %s\nlogs:\n%s", what, rec.Code, rec.Body, fa.logs.tail(2000))
	}
	if rec.Code < 400 {
		return
	}
	var env struct {
		Error *struct {
			Code       string `json:"code"`
			HTTPStatus int    `json:"httpStatus"`
			Message    string `json:"message"`
			RequestID  string `json:"requestId"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil || env.Error == nil {
		t.Fatalf("%s: %d without the error envelope: %q", what, rec.Code, rec.Body)
	}
	if env.Error.Code == "" || env.Error.HTTPStatus != rec.Code || env.Error.Message == "" || env.Error.RequestID == "" {
		t.Fatalf("%s: %d with a partial envelope: %s", what, rec.Code, rec.Body)
	}
	if after := fa.counts(t); after != before {
		t.Fatalf("%s: %d %s left rows behind: %+v -> %+v", what, rec.Code, rec.Body, before, after)
	}
}

// tokenFor picks the credentials of a fuzzed request: 0 the user's token,
// 1 the admin's, 2 none, 3 raw as a bearer token, 4 raw as the cookie, 5 a
// token minted for tenant raw (none when Mint refuses it).
func (fa *fuzzApp) tokenFor(t testing.TB, mode uint8, raw string) http.Header {
	h := http.Header{}
	switch mode % 6 {
	case 0:
		h.Set("Authorization", "Bearer "+fa.user)
	case 1:
		h.Set("Authorization", "Bearer "+fa.admin)
	case 3:
		h.Set("Authorization", "Bearer "+raw)
	case 4:
		h.Set("Cookie", auth.CookieName+"="+raw)
	case 5:
		if tok, err := fa.ring.Mint(auth.Principal{UserID: "u1", TenantID: raw}, time.Hour); err == nil {
			h.Set("Authorization", "Bearer "+tok)
		}
	}
	return h
}

// FuzzHTTPWrite: POST /api/write and /api/batch with any body, any
// Idempotency-Key and request id.
func FuzzHTTPWrite(f *testing.F) {
	fa := newFuzzApp(f)
	order := fa.orderID
	for _, s := range []struct {
		batch      bool
		body, key  string
		mode       uint8
		requestID  string
		tokenInput string
	}{
		{false, `{"type":"orders:write:place","payload":{"customer":"c","amountCents":5}}`, "", 0, "", ""},
		{false, `{"type":"orders:write:place","payload":{"customer":"c","amountCents":-5}}`, "", 0, "", ""},
		{false, `{"type":"orders:write:place","payload":{"customer":"c","amountCents":1e30}}`, "", 0, "", ""},
		{false, `{"type":"orders:write:place","payload":{"customer":"c\u0000","amountCents":5},"requestId":"k-1"}`, "", 0, "", ""},
		{false, `{"type":"orders:write:place","payload":{"customer":"c","amountCents":5},"requestId":"k-2"}`, "k-2", 0, "r1", ""},
		{false, `{"type":"orders:write:place","payload":{"customer":"c","amountCents":5},"requestId":"k-2"}`, "k-3", 0, "", ""},
		{false, `{"type":"orders:write:cancel","payload":{"orderId":"` + order + `","expectedVersion":1}}`, "", 0, "", ""},
		{false, `{"type":"orders:write:cancel","payload":{"orderId":"` + strings.ToUpper(order) + `","expectedVersion":2}}`, "", 0, "", ""},
		{false, `{"type":"orders:write:cancel","payload":{"orderId":"00000000-0000-0000-0000-000000000000","expectedVersion":9223372036854775807}}`, "", 0, "", ""},
		{false, `{"type":"users:write:invite","payload":{"email":"a@b.c"}}`, "", 0, "", ""},
		{false, `{"type":"users:write:invite","payload":{"email":"not an email"}}`, "", 5, "", "t\u00e9nant"},
		{false, `{"type":"orders:query:list","payload":{}}`, "", 0, "", ""},
		{false, `{"type":"nope","payload":null}`, "", 3, "", "x.y.z"},
		{false, `{"type":"orders:write:place","payload":[1]}`, "", 4, "", "garbage"},
		{false, `{"type":"orders:write:place","payload":{"customer":"c"},"extra":{"a":[[[[[[]]]]]]}}`, "", 0, "", ""},
		{true, `{"commands":[{"type":"orders:write:place","payload":{"customer":"c","amountCents":5}},{"type":"users:write:invite","payload":{"email":"x"}}]}`, "", 0, "", ""},
		{true, `{"commands":[{"type":"users:write:invite","payload":{"email":"a@b.c"}}],"requestId":"b-1"}`, "", 1, "", ""},
		{true, `{"commands":[{"type":"","payload":{}}]}`, "", 0, "", ""},
		{true, `{"commands":[]}`, " ", 0, "", ""},
	} {
		f.Add(s.batch, []byte(s.body), s.key, s.mode, s.requestID, s.tokenInput)
	}
	f.Fuzz(func(t *testing.T, batch bool, body []byte, key string, mode uint8, requestID, tokenInput string) {
		path := "/api/write"
		if batch {
			path = "/api/batch"
		}
		h := fa.tokenFor(t, mode, tokenInput)
		h.Set("Content-Type", "application/json")
		if key != "" {
			h.Set("Idempotency-Key", key)
		}
		if requestID != "" {
			h.Set("X-Request-ID", requestID)
		}
		before := fa.counts(t)
		rec := fa.serve(t, http.MethodPost, path, body, h, 0)
		fa.check(t, path, rec, before)
	})
}

// FuzzHTTPQuery: POST /api/query with any body and consistency token.
func FuzzHTTPQuery(f *testing.F) {
	fa := newFuzzApp(f)
	for _, s := range []struct {
		body, token string
		mode        uint8
	}{
		{`{"type":"orders:query:list","payload":{"limit":2}}`, "", 0},
		{`{"type":"orders:query:list","payload":{"limit":2,"after":"` + fa.orderID + `"}}`, "", 0},
		{`{"type":"orders:query:list","payload":{"limit":0,"after":"zz"}}`, "", 0},
		{`{"type":"orders:query:get","payload":{"orderId":"` + strings.ToUpper(fa.orderID) + `"}}`, "", 0},
		{`{"type":"orders:query:get","payload":{"orderId":"` + fa.orderID + `"},"consistencyToken":"0/0"}`, "", 0},
		{`{"type":"orders:query:get","payload":{"orderId":"x"}}`, "FFFFFFFF/FFFFFFFF", 0},
		{`{"type":"orders:query:get","payload":{"orderId":"` + fa.orderID + `"}}`, "garbage", 0},
		{`{"type":"orders:write:place","payload":{}}`, "", 0},
		{`{"type":"orders:query:list","payload":{}}`, "", 2},
	} {
		f.Add([]byte(s.body), s.token, s.mode, "")
	}
	f.Fuzz(func(t *testing.T, body []byte, token string, mode uint8, tokenInput string) {
		h := fa.tokenFor(t, mode, tokenInput)
		h.Set("Content-Type", "application/json")
		if token != "" {
			h.Set("X-Kumiko-Consistency-Token", token)
		}
		before := fa.counts(t)
		rec := fa.serve(t, http.MethodPost, "/api/query", body, h, 0)
		fa.check(t, "/api/query", rec, before)
	})
}

// FuzzHTTPGet: the event stream's query and Last-Event-ID, and the admin
// endpoints' paths and query parameters.
func FuzzHTTPGet(f *testing.F) {
	fa := newFuzzApp(f)
	for _, s := range []struct {
		method, target, lastEventID string
		mode                        uint8
	}{
		{"GET", "/api/sse", "", 0},
		{"GET", "/api/sse?types=orders:event:placed&streamTypes=order", "", 0},
		{"GET", "/api/sse?types=nope", "", 0},
		{"GET", "/api/sse?lastEventId=1-2", "", 0},
		{"GET", "/api/sse", "ffffffffffffffff-ffffffffffffffff", 0},
		{"GET", "/api/sse?lastEventId=%00", "abc", 0},
		{"GET", "/api/admin/consumers", "", 1},
		{"GET", "/api/admin/consumers?instance=", "", 1},
		{"GET", "/api/admin/consumers/users:projection:send-welcome-email?instance=x", "", 1},
		{"GET", "/api/admin/consumers/a%zz", "", 1},
		{"POST", "/api/admin/consumers/users:projection:send-welcome-email/disable?instance=nope", "", 1},
		{"POST", "/api/admin/consumers/users:projection:send-welcome-email/rewind", "", 1},
		{"GET", "/api/admin/jobs?state=archived&lane=worker&limit=50", "", 1},
		{"GET", "/api/admin/jobs?state=&lane=x&limit=-1", "", 1},
		{"GET", "/api/admin/jobs?limit=99999999999999999999", "", 1},
		{"POST", "/api/admin/jobs/worker/%2F/retry", "", 1},
		{"GET", "/api/admin/migrations", "", 0},
		{"POST", "/api/admin/events/prune", "", 1},
		{"POST", "/api/admin/projections/orders:projection:order-totals/rebuild", "", 1},
	} {
		f.Add(s.method == "POST", s.target, s.lastEventID, s.mode, []byte(nil), "")
	}
	f.Fuzz(func(t *testing.T, post bool, target, lastEventID string, mode uint8, body []byte, tokenInput string) {
		if !strings.HasPrefix(target, "/") {
			return
		}
		method := http.MethodGet
		if post {
			method = http.MethodPost
		}
		h := fa.tokenFor(t, mode, tokenInput)
		if lastEventID != "" {
			h.Set("Last-Event-ID", lastEventID)
		}
		if body != nil {
			h.Set("Content-Type", "application/json")
		}
		before := fa.counts(t)
		rec := fa.serve(t, method, target, body, h, 50*time.Millisecond)
		if rec == nil {
			return // not a request target net/http parses
		}
		fa.check(t, method+" "+target, rec, before)
	})
}

// FuzzHTTPClaims: a token the server's key signed, with any claims, on a
// write, a keyed write, a query and the event stream (the tenant and user
// ids reach set_config, row-level security and the idempotency keys).
func FuzzHTTPClaims(f *testing.F) {
	fa := newFuzzApp(f)
	exp := time.Now().Add(24 * time.Hour).Unix()
	for _, claims := range []string{
		`{"sub":"u1","tenantId":"fuzz-a","exp":EXP}`,
		`{"sub":"u1","tenantId":"fuzz-b","roles":["admin"],"exp":EXP}`,
		`{"sub":"u1","tenantId":"a'b\"c\\d","exp":EXP}`,
		`{"sub":"` + strings.Repeat("u", 300) + `","tenantId":"` + strings.Repeat("t", 5000) + `","exp":EXP}`,
		`{"sub":"u1","tenantId":"__system__","exp":EXP}`,
		`{"sub":"u1","tenantId":"t\u00e9 \u2028\ud83d\ude00","exp":EXP,"nbf":0,"iat":0}`,
		`{"sub":"u1","tenantId":"t","roles":null,"exp":EXP}`,
		`{"sub":"u1","tenantId":"t","roles":["admin",""],"exp":EXP,"aud":["x"]}`,
		`{"sub":1,"tenantId":"t","exp":EXP}`,
	} {
		for route := range uint8(4) {
			f.Add([]byte(strings.ReplaceAll(claims, "EXP", strconv.FormatInt(exp, 10))), route)
		}
	}
	key := []byte(jwtSecret)
	f.Fuzz(func(t *testing.T, claims []byte, route uint8) {
		enc := base64.RawURLEncoding.EncodeToString
		signing := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc(claims)
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(signing))
		tok := signing + "." + enc(mac.Sum(nil))
		h := http.Header{"Authorization": {"Bearer " + tok}, "Content-Type": {"application/json"}}
		method, path, body := http.MethodPost, "/api/write", `{"type":"orders:write:place","payload":{"customer":"c","amountCents":1}}`
		switch route % 4 {
		case 1:
			h.Set("Idempotency-Key", "claims-key")
		case 2:
			path, body = "/api/query", `{"type":"orders:query:list","payload":{"limit":1}}`
		case 3:
			method, path, body = http.MethodGet, "/api/sse?lastEventId=1-1", ""
		}
		before := fa.counts(t)
		rec := fa.serve(t, method, path, []byte(body), h, 50*time.Millisecond)
		fa.check(t, method+" "+path, rec, before)
	})
}
