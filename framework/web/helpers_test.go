package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

// bundle is one server on its own database.
type bundle struct {
	db     *kumikotest.DB
	url    string
	client *http.Client
	keys   *auth.Keyring
	logs   *lockedBuffer
}

// empty is the payload of the test feature's writes.
type empty struct{}

// setup starts a server with the orders feature and a "web-test" feature
// (a role-protected write, a write failing with a plain error, a write that
// panics) on a fresh database.
func setup(t *testing.T) *bundle {
	t.Helper()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	o := orders.Register(reg)
	f := reg.Feature("web-test")
	framework.Write(f, "admin-only", func(_ context.Context, _ *framework.Tx, _ empty) (map[string]bool, error) {
		return map[string]bool{"ok": true}, nil
	}, &framework.WriteOptions[empty, map[string]bool]{Roles: []string{"admin"}})
	framework.Write(f, "boom", func(_ context.Context, _ *framework.Tx, _ empty) (any, error) {
		return nil, errors.New("secret connection detail")
	}, nil)
	// denied does what the tenant role may not: the database refuses it
	// (42501), as it refuses a feature table whose migration forgot its
	// grants.
	framework.Write(f, "denied", func(ctx context.Context, tx *framework.Tx, _ empty) (any, error) {
		_, err := tx.Exec(ctx, `UPDATE events SET type = type WHERE false`)
		return nil, err
	}, nil)
	framework.Write(f, "panic", func(_ context.Context, _ *framework.Tx, _ empty) (any, error) {
		panic("handler exploded")
	}, nil)
	// write-then-panic and write-then-fail insert an order row, append its
	// event and flush it, then panic or fail.
	writeThen := func(ctx context.Context, tx *framework.Tx, fail bool) (any, error) {
		id := uuid.NewString()
		if _, err := tx.Exec(ctx, `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ($1, $2, 'x', 1)`, tx.TenantID(), id); err != nil {
			return nil, err
		}
		if err := tx.Append(framework.Stream{Type: orders.StreamType, ID: id}, framework.NoStream,
			o.Placed.With(orders.Placed{OrderID: id, Customer: "x", AmountCents: 1})); err != nil {
			return nil, err
		}
		if _, err := tx.Flush(ctx); err != nil {
			return nil, err
		}
		if fail {
			return nil, framework.Errorf(framework.CodeUnprocessable, "changed my mind")
		}
		panic("handler exploded after writing")
	}
	framework.Write(f, "write-then-panic", func(ctx context.Context, tx *framework.Tx, _ empty) (any, error) {
		return writeThen(ctx, tx, false)
	}, nil)
	framework.Write(f, "write-then-fail", func(ctx context.Context, tx *framework.Tx, _ empty) (any, error) {
		return writeThen(ctx, tx, true)
	}, nil)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret}})
	require.NoError(t, err)
	logs := &lockedBuffer{}
	s := web.New(rt, keys, &web.Config{Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	s.Echo().GET("/api/whoami", func(c echo.Context) error {
		p, ok := web.PrincipalFrom(c)
		call := web.CallFrom(c)
		return c.JSON(http.StatusOK, map[string]any{"ok": ok, "userId": p.UserID, "tenantId": p.TenantID,
			"requestId": call.RequestID, "correlationId": call.CorrelationID})
	}, s.Authenticate)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &bundle{db: db, url: srv.URL, client: srv.Client(), keys: keys, logs: logs}
}

// token mints a token for user "u-<tenant>" of tenant.
func (b *bundle) token(t *testing.T, tenant string, roles ...string) string {
	t.Helper()
	tok, err := b.keys.Mint(auth.Principal{UserID: "u-" + tenant, TenantID: tenant, Roles: roles}, time.Hour)
	require.NoError(t, err)
	return tok
}

// response is a finished HTTP exchange.
type response struct {
	status int
	header http.Header
	body   []byte
}

// request describes one call; zero fields mean: POST, no token, no body,
// Content-Type application/json.
type request struct {
	method  string
	path    string
	token   string
	body    any // string or []byte: sent as is; io.Reader: streamed (chunked); else JSON-encoded
	headers map[string]string
	// added holds headers sent in addition, each value as its own line.
	added  http.Header
	cookie string
}

func (b *bundle) do(t *testing.T, r request) response {
	t.Helper()
	var body io.Reader
	switch v := r.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(v)
	case []byte:
		body = bytes.NewReader(v)
	case io.Reader:
		body = v
	default:
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		body = bytes.NewReader(raw)
	}
	method := r.method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(t.Context(), method, b.url+r.path, body)
	require.NoError(t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.cookie != "" {
		req.AddCookie(&http.Cookie{Name: auth.CookieName, Value: r.cookie})
	}
	for k, v := range r.headers {
		req.Header.Set(k, v)
	}
	for k, vs := range r.added {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	res, err := b.client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: raw}
}

// post sends body to path with token.
func (b *bundle) post(t *testing.T, path, token string, body any) response {
	t.Helper()
	return b.do(t, request{path: path, token: token, body: body})
}

// envelope is the error body.
type envelope struct {
	Error struct {
		Code       string         `json:"code"`
		HTTPStatus int            `json:"httpStatus"`
		Message    string         `json:"message"`
		Details    map[string]any `json:"details"`
		RequestID  string         `json:"requestId"`
	} `json:"error"`
}

// requireError asserts an error envelope of status and code whose requestId
// is the response's X-Request-ID, and returns it.
func (r response) requireError(t *testing.T, status int, code string) envelope {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&env), "body: %s", r.body)
	require.Equal(t, code, env.Error.Code, "body: %s", r.body)
	require.Equal(t, status, env.Error.HTTPStatus)
	require.NotEmpty(t, env.Error.Message)
	require.NotEmpty(t, env.Error.RequestID)
	require.Equal(t, r.header.Get(web.HeaderRequestID), env.Error.RequestID)
	return env
}

// requireData asserts a 200 {"data": ...} and decodes data into v.
func (r response) requireData(t *testing.T, v any) {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var out struct {
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(r.body, &out))
	require.NoError(t, json.Unmarshal(out.Data, v), "data: %s", out.Data)
}

// requireField asserts that details.fields names field (with rule, unless "").
func requireField(t *testing.T, env envelope, field, rule string) {
	t.Helper()
	fields, ok := env.Error.Details["fields"].([]any)
	require.True(t, ok, "details: %v", env.Error.Details)
	for _, f := range fields {
		m := f.(map[string]any)
		if m["field"] == field && (rule == "" || m["rule"] == rule) {
			return
		}
	}
	require.Failf(t, "field not reported", "want field %q rule %q in %v", field, rule, fields)
}

// count returns the rows of table across all tenants (the pool is a superuser).
func (b *bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// requireRows asserts the number of orders rows and events.
func (b *bundle) requireRows(t *testing.T, orderRows, events int) {
	t.Helper()
	require.Equal(t, orderRows, b.count(t, "orders"), "orders rows")
	require.Equal(t, events, b.count(t, "events"), "events rows")
}

// place places an order for token and returns its id.
func (b *bundle) place(t *testing.T, token, customer string) string {
	t.Helper()
	var res orders.WriteResult
	b.post(t, "/api/write", token, map[string]any{"type": "orders:write:place",
		"payload": map[string]any{"customer": customer, "amountCents": 100}}).requireData(t, &res)
	return res.ID
}

// lockedBuffer is a log sink safe for concurrent use.
type lockedBuffer struct{ proctest.Buffer }

// lines returns the decoded log records whose msg is msg.
func (l *lockedBuffer) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	raw := l.String()
	var out []map[string]any
	for line := range strings.Lines(raw) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		if rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}
