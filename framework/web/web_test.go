package web_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/web"
)

func placeBody(payload any) map[string]any {
	return map[string]any{"type": "orders:write:place", "payload": payload}
}

func TestPlace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.do(t, request{path: "/api/write", token: b.token(t, "t1"),
		body:    placeBody(map[string]any{"customer": "Ada", "amountCents": 4200}),
		headers: map[string]string{web.HeaderRequestID: "req-place-1", web.HeaderCorrelationID: "corr-1"}})
	var out orders.WriteResult
	res.requireData(t, &out)
	_, err := uuid.Parse(out.ID)
	require.NoError(t, err)
	require.Equal(t, int64(1), out.Version)
	require.Equal(t, "req-place-1", res.header.Get(web.HeaderRequestID))
	require.Equal(t, "corr-1", res.header.Get(web.HeaderCorrelationID))
	b.requireRows(t, 1, 1)

	var typ, streamType, streamID, tenant string
	var meta map[string]any
	require.NoError(t, b.db.Pool.QueryRow(t.Context(),
		`SELECT type, stream_type, stream_id, tenant_id, metadata FROM events`).Scan(&typ, &streamType, &streamID, &tenant, &meta))
	require.Equal(t, "orders:event:placed", typ)
	require.Equal(t, "order/"+out.ID, streamType+"/"+streamID)
	require.Equal(t, "t1", tenant)
	require.Equal(t, "u-t1", meta["userId"])
	require.Equal(t, "req-place-1", meta["requestId"])
	require.Equal(t, "corr-1", meta["correlationId"])
}

func TestRequestIDGenerated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The body's requestId is accepted but is not the request id.
	res := b.post(t, "/api/write", b.token(t, "t1"), map[string]any{"type": "orders:write:place",
		"payload": map[string]any{"customer": "Ada"}, "requestId": "body-key-1"})
	var out orders.WriteResult
	res.requireData(t, &out)
	rid := res.header.Get(web.HeaderRequestID)
	_, err := uuid.Parse(rid)
	require.NoError(t, err, "generated request id %q", rid)
	require.Equal(t, rid, res.header.Get(web.HeaderCorrelationID))
	var meta map[string]any
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT metadata FROM events`).Scan(&meta))
	require.Equal(t, rid, meta["requestId"])
	require.Equal(t, rid, meta["correlationId"])

	for name, bad := range map[string]string{
		"too long":  strings.Repeat("r", 129),
		"tab":       "req\tid",
		"non-ascii": "req-ü",
	} {
		res := b.do(t, request{method: http.MethodGet, path: "/nope", headers: map[string]string{web.HeaderRequestID: bad}})
		env := res.requireError(t, http.StatusNotFound, "not_found")
		require.NotEqual(t, bad, env.Error.RequestID, name)
		_, err := uuid.Parse(env.Error.RequestID)
		require.NoError(t, err, name)
	}
	// 128 printable characters are kept.
	sane := strings.Repeat("a b~", 32)
	res = b.do(t, request{method: http.MethodGet, path: "/nope", headers: map[string]string{web.HeaderRequestID: sane}})
	require.Equal(t, sane, res.requireError(t, http.StatusNotFound, "not_found").Error.RequestID)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "t1")
	id := b.place(t, tok, "Ada")
	b.requireRows(t, 1, 1)

	// The id in upper case: the same order, the same stream.
	cancel := func(expected int) response {
		return b.post(t, "/api/write", tok, map[string]any{"type": "orders:write:cancel",
			"payload": map[string]any{"orderId": strings.ToUpper(id), "expectedVersion": expected}})
	}
	env := cancel(5).requireError(t, http.StatusConflict, "version_conflict")
	require.InDelta(t, 5, env.Error.Details["expectedVersion"], 0)
	require.InDelta(t, 1, env.Error.Details["actualVersion"], 0)
	b.requireRows(t, 1, 1)

	var out orders.WriteResult
	cancel(1).requireData(t, &out)
	require.Equal(t, orders.WriteResult{ID: id, Version: 2}, out)
	b.requireRows(t, 1, 2)

	cancel(2).requireError(t, http.StatusConflict, "conflict")
	b.requireRows(t, 1, 2)
}

func TestQueries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t1, t2 := b.token(t, "t1"), b.token(t, "t2")
	a := b.place(t, t1, "Ada")
	b.place(t, t1, "Bob")
	other := b.place(t, t2, "Eve")

	var o orders.Order
	b.post(t, "/api/query", t1, map[string]any{"type": "orders:query:get", "payload": map[string]any{"orderId": a}}).requireData(t, &o)
	require.Equal(t, "Ada", o.Customer)
	require.Equal(t, "placed", o.Status)

	var list orders.ListResult
	b.post(t, "/api/query", t1, map[string]any{"type": "orders:query:list"}).requireData(t, &list)
	require.Len(t, list.Items, 2)
	for _, it := range list.Items {
		require.NotEqual(t, other, it.ID)
	}

	b.post(t, "/api/query", t1, map[string]any{"type": "orders:query:get",
		"payload": map[string]any{"orderId": uuid.NewString()}}).requireError(t, http.StatusNotFound, "not_found")
	// Another tenant's order does not exist for t1 (row-level security).
	b.post(t, "/api/query", t1, map[string]any{"type": "orders:query:get",
		"payload": map[string]any{"orderId": other}}).requireError(t, http.StatusNotFound, "not_found")
	b.post(t, "/api/query", t2, map[string]any{"type": "orders:query:get",
		"payload": map[string]any{"orderId": other}}).requireData(t, &o)
	require.Equal(t, "Eve", o.Customer)
	b.requireRows(t, 3, 3)
}

func TestBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res := b.do(t, request{path: "/api/batch", token: b.token(t, "t1"), headers: map[string]string{web.HeaderCorrelationID: "corr-batch"},
		body: map[string]any{"requestId": "k", "commands": []any{
			placeBody(map[string]any{"customer": "A"}),
			placeBody(map[string]any{"customer": "B"}),
			placeBody(map[string]any{"customer": "C"}),
		}}})
	var out []orders.WriteResult
	res.requireData(t, &out)
	require.Len(t, out, 3)
	b.requireRows(t, 3, 3)
	var corrs []string
	rows, err := b.db.Pool.Query(t.Context(), `SELECT DISTINCT metadata->>'correlationId' FROM events`)
	require.NoError(t, err)
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		corrs = append(corrs, c)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"corr-batch"}, corrs)
}

func TestRoles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := map[string]any{"type": "web-test:write:admin-only"}
	env := b.post(t, "/api/write", b.token(t, "t1"), body).requireError(t, http.StatusForbidden, "access_denied")
	require.Contains(t, env.Error.Message, "admin")
	var out map[string]bool
	b.post(t, "/api/write", b.token(t, "t1", "admin"), body).requireData(t, &out)
	require.True(t, out["ok"])
}

func TestCookie(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var out orders.WriteResult
	b.do(t, request{path: "/api/write", cookie: b.token(t, "t1"), body: placeBody(map[string]any{"customer": "Ada"})}).requireData(t, &out)
	b.requireRows(t, 1, 1)

	// A state-changing cookie request must be JSON (CSRF protection).
	b.do(t, request{path: "/api/write", cookie: b.token(t, "t1"), body: `{"type":"orders:write:place","payload":{"customer":"x=y"}}`,
		headers: map[string]string{"Content-Type": "text/plain"}}).requireError(t, http.StatusForbidden, "access_denied")
	// A bearer request may send any content type.
	b.do(t, request{path: "/api/write", token: b.token(t, "t1"), body: placeBody(map[string]any{"customer": "Bob"}),
		headers: map[string]string{"Content-Type": "text/plain"}}).requireData(t, &out)
	b.requireRows(t, 2, 2)

	// A cookie GET needs no content type.
	res := b.do(t, request{method: http.MethodGet, path: "/api/whoami", cookie: b.token(t, "t2"),
		headers: map[string]string{web.HeaderRequestID: "who-1"}})
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	var who map[string]any
	require.NoError(t, json.Unmarshal(res.body, &who))
	require.Equal(t, map[string]any{"ok": true, "userId": "u-t2", "tenantId": "t2", "requestId": "who-1", "correlationId": "who-1"}, who)
}

func TestInternalErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "t1")
	for _, typ := range []string{"web-test:write:boom", "web-test:write:panic"} {
		res := b.do(t, request{path: "/api/write", token: tok, body: map[string]any{"type": typ},
			headers: map[string]string{web.HeaderRequestID: "rid-" + typ}})
		env := res.requireError(t, http.StatusInternalServerError, "internal")
		require.Equal(t, "internal error", env.Error.Message)
		require.Nil(t, env.Error.Details)
		require.NotContains(t, string(res.body), "secret")
		require.NotContains(t, string(res.body), "exploded")
	}
	// Batch: the index does not leak either, the message stays opaque.
	res := b.post(t, "/api/batch", tok, map[string]any{"commands": []any{
		placeBody(map[string]any{"customer": "A"}), map[string]any{"type": "web-test:write:boom"},
	}})
	env := res.requireError(t, http.StatusInternalServerError, "internal")
	require.Equal(t, "internal error", env.Error.Message)
	b.requireRows(t, 0, 0)

	internal := b.logs.lines(t, "internal error")
	require.Len(t, internal, 2)
	require.Equal(t, "rid-web-test:write:boom", internal[0]["request_id"])
	require.Contains(t, internal[0]["error"], "secret connection detail")
	panics := b.logs.lines(t, "panic recovered")
	require.Len(t, panics, 1)
	require.Equal(t, "rid-web-test:write:panic", panics[0]["request_id"])
	require.Contains(t, panics[0]["error"], "handler exploded")
	require.Contains(t, panics[0]["stack"], "web_test")

	// The server keeps serving after a panic.
	var out orders.WriteResult
	b.post(t, "/api/write", tok, placeBody(map[string]any{"customer": "Ada"})).requireData(t, &out)
	require.NotEmpty(t, b.logs.lines(t, "http request"))
}

// signed returns an HS256 token of claims signed with key under kid k1.
func signed(t *testing.T, key []byte, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(key)
	require.NoError(t, err)
	return s
}

func claims(tenant string, exp time.Time) jwt.MapClaims {
	return jwt.MapClaims{"sub": "u1", "tenantId": tenant, "roles": []string{"admin"},
		"iat": time.Now().Add(-2 * time.Hour).Unix(), "exp": exp.Unix()}
}

// TestRejected runs every request that must fail on one database and checks
// that none of them persisted anything.
func TestRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "t1")
	b64 := base64.RawURLEncoding.EncodeToString
	later := time.Now().Add(time.Hour)
	claimsJSON, err := json.Marshal(claims("t1", later))
	require.NoError(t, err)
	algNone := b64([]byte(`{"alg":"none","typ":"JWT","kid":"k1"}`)) + "." + b64(claimsJSON) + "."

	deep := func(n int) string {
		return `{"type":"orders:write:place","payload":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
	}
	hugeBody := func() string {
		return `{"type":"orders:write:place","payload":{"customer":"` + strings.Repeat("a", 1<<20) + `"}}`
	}
	places := func(n int) []any {
		cmds := make([]any, n)
		for i := range cmds {
			cmds[i] = placeBody(map[string]any{"customer": "c"})
		}
		return cmds
	}

	type check func(t *testing.T, res response, env envelope)
	field := func(name, rule string) check {
		return func(t *testing.T, _ response, env envelope) { t.Helper(); requireField(t, env, name, rule) }
	}
	index := func(i int) check {
		return func(t *testing.T, _ response, env envelope) {
			t.Helper()
			require.InDelta(t, i, env.Error.Details["index"], 0, "details: %v", env.Error.Details)
		}
	}
	knownTypes := func(want string) check {
		return func(t *testing.T, _ response, env envelope) {
			t.Helper()
			require.Contains(t, env.Error.Details["knownTypes"], want)
		}
	}
	message := func(sub string) check {
		return func(t *testing.T, _ response, env envelope) { t.Helper(); require.Contains(t, env.Error.Message, sub) }
	}
	smallerThan := func(n int) check {
		return func(t *testing.T, res response, _ envelope) {
			t.Helper()
			require.Less(t, len(res.body), n, "a %d-byte answer", len(res.body))
		}
	}
	header := func(name, sub string) check {
		return func(t *testing.T, res response, _ envelope) {
			t.Helper()
			require.Contains(t, res.header.Get(name), sub)
		}
	}

	cases := []struct {
		name   string
		req    request
		status int
		code   string
		checks []check
	}{
		// Payload validation.
		{"missing customer", request{path: "/api/write", token: tok, body: placeBody(map[string]any{"amountCents": 1})},
			400, "validation_error", []check{field("customer", "required")}},
		{"customer too long", request{path: "/api/write", token: tok, body: placeBody(map[string]any{"customer": strings.Repeat("x", 201)})},
			400, "validation_error", []check{field("customer", "max")}},
		{"negative amount", request{path: "/api/write", token: tok, body: placeBody(map[string]any{"customer": "A", "amountCents": -1})},
			400, "validation_error", []check{field("amountCents", "gte")}},
		// Two such orders would overflow the bigint sum of the shared
		// orders:order-totals projection and stop it for every tenant.
		{"amount over the cap", request{path: "/api/write", token: tok, body: placeBody(map[string]any{"customer": "A", "amountCents": int64(1) << 62})},
			400, "validation_error", []check{field("amountCents", "lte")}},
		{"wrong type", request{path: "/api/write", token: tok, body: placeBody(map[string]any{"customer": 5})},
			400, "validation_error", []check{field("customer", "type")}},
		{"unknown payload field", request{path: "/api/write", token: tok, body: placeBody(map[string]any{"customer": "A", "colour": "red"})},
			400, "validation_error", []check{field("colour", "unknown")}},
		{"missing type", request{path: "/api/write", token: tok, body: map[string]any{"payload": map[string]any{}}},
			400, "validation_error", []check{field("type", "required")}},
		{"query missing type", request{path: "/api/query", token: tok, body: `{}`},
			400, "validation_error", []check{field("type", "required")}},
		{"unknown write type", request{path: "/api/write", token: tok, body: map[string]any{"type": "orders:write:plase"}},
			404, "not_found", []check{knownTypes("orders:write:place")}},
		{"unknown query type", request{path: "/api/query", token: tok, body: map[string]any{"type": "orders:query:gett"}},
			404, "not_found", []check{knownTypes("orders:query:get")}},
		{"query of a write type", request{path: "/api/query", token: tok, body: map[string]any{"type": "orders:write:place"}},
			404, "not_found", nil},
		// The answer repeats 200 bytes of the type, not the client's
		// megabyte (each DEL would cost five bytes, quoted and escaped).
		{"unknown type of a megabyte", request{path: "/api/write", token: tok, body: map[string]any{"type": strings.Repeat("\x7f:", 250_000)}},
			404, "not_found", []check{smallerThan(2000), message("unknown write type")}},

		// Envelope decoding.
		{"malformed json", request{path: "/api/write", token: tok, body: `{"type": "orders:write:place", "payload": {"customer": }}`},
			400, "bad_request", []check{message("malformed JSON")}},
		{"truncated json", request{path: "/api/write", token: tok, body: `{"type": "orders:write:place"`},
			400, "bad_request", []check{message("malformed JSON")}},
		{"empty body", request{path: "/api/write", token: tok, body: ``},
			400, "bad_request", []check{message("empty")}},
		{"array body", request{path: "/api/write", token: tok, body: `[{"type": "orders:write:place"}]`},
			400, "bad_request", []check{message("JSON object")}},
		{"null body", request{path: "/api/query", token: tok, body: `null`},
			400, "bad_request", []check{message("JSON object")}},
		{"trailing data", request{path: "/api/write", token: tok, body: `{"type": "orders:write:place"} {}`},
			400, "bad_request", []check{message("after")}},
		// Postgres stores a NUL neither in text nor in jsonb.
		{"NUL in a payload string", request{path: "/api/write", token: tok, body: `{"type":"orders:write:place","payload":{"customer":"A\u0000B"}}`},
			400, "bad_request", []check{message("NUL")}},
		{"NUL in a batch", request{path: "/api/batch", token: tok, body: `{"commands":[{"type":"orders:write:place","payload":{"customer":"\u0000"}}]}`},
			400, "bad_request", []check{message("NUL")}},
		{"unknown top-level field", request{path: "/api/write", token: tok, body: map[string]any{"type": "orders:write:place", "extra": 1}},
			400, "bad_request", []check{message(`"extra"`)}},
		{"type not a string", request{path: "/api/write", token: tok, body: `{"type": 5}`},
			400, "bad_request", []check{message("type must be a string")}},
		{"query with requestId", request{path: "/api/query", token: tok, body: map[string]any{"type": "orders:query:list", "requestId": "x"}},
			400, "bad_request", nil},
		{"nested 10k deep", request{path: "/api/write", token: tok, body: deep(10000)},
			400, "bad_request", []check{message("deeper than 64")}},
		{"nested 65 deep", request{path: "/api/write", token: tok, body: deep(64)},
			400, "bad_request", []check{message("deeper than 64")}},
		// 63 arrays inside the body's object are within the limit: the
		// payload reaches the handler's decoder, which rejects an array.
		{"nested 64 deep", request{path: "/api/write", token: tok, body: deep(63)},
			400, "validation_error", nil},
		{"body over 1 MiB", request{path: "/api/write", token: tok, body: hugeBody()},
			413, "payload_too_large", []check{message("1048576")}},
		{"chunked body over 1 MiB", request{path: "/api/write", token: tok, body: io.MultiReader(strings.NewReader(hugeBody()))},
			413, "payload_too_large", nil},

		// Batches.
		{"batch second invalid", request{path: "/api/batch", token: tok, body: map[string]any{"commands": []any{
			placeBody(map[string]any{"customer": "A"}), placeBody(map[string]any{"customer": ""}), placeBody(map[string]any{"customer": "C"}),
		}}}, 400, "validation_error", []check{index(1), field("customer", "required")}},
		{"batch of one invalid", request{path: "/api/batch", token: tok, body: map[string]any{"commands": []any{placeBody(map[string]any{})}}},
			400, "validation_error", []check{index(0), field("customer", "required")}},
		{"batch unknown type", request{path: "/api/batch", token: tok, body: map[string]any{"commands": []any{
			placeBody(map[string]any{"customer": "A"}), placeBody(map[string]any{"customer": "B"}), map[string]any{"type": "orders:write:nope"},
		}}}, 404, "not_found", []check{index(2), knownTypes("orders:write:place")}},
		{"batch missing type", request{path: "/api/batch", token: tok, body: map[string]any{"commands": []any{
			placeBody(map[string]any{"customer": "A"}), map[string]any{"payload": map[string]any{}},
		}}}, 400, "validation_error", []check{index(1), field("type", "required")}},
		{"batch conflicting cancel", request{path: "/api/batch", token: tok, body: map[string]any{"commands": []any{
			placeBody(map[string]any{"customer": "A"}),
			map[string]any{"type": "orders:write:cancel", "payload": map[string]any{"orderId": uuid.NewString(), "expectedVersion": 1}},
		}}}, 404, "not_found", []check{index(1)}},
		{"batch empty", request{path: "/api/batch", token: tok, body: map[string]any{"commands": []any{}}},
			400, "validation_error", []check{field("commands", "required")}},
		{"batch without commands", request{path: "/api/batch", token: tok, body: `{}`},
			400, "validation_error", []check{field("commands", "required")}},
		{"batch of 101", request{path: "/api/batch", token: tok, body: map[string]any{"commands": places(101)}},
			400, "validation_error", []check{field("commands", "max")}},
		{"batch commands not an array", request{path: "/api/batch", token: tok, body: `{"commands": {}}`},
			400, "bad_request", []check{message("commands must be an array")}},
		{"batch unknown command field", request{path: "/api/batch", token: tok, body: `{"commands": [{"type": "orders:write:place", "x": 1}]}`},
			400, "bad_request", []check{message(`unknown field "commands[0].x"`)}},
		// The envelope's errors name the command by its index.
		{"batch third type not a string", request{path: "/api/batch", token: tok,
			body: `{"commands": [{"type": "orders:write:place"}, {"type": "orders:write:place"}, {"type": 5}]}`},
			400, "bad_request", []check{message("commands[2].type must be a string, got number")}},
		{"batch second unknown command field", request{path: "/api/batch", token: tok,
			body: `{"commands": [{"type": "orders:write:place"}, {"type": "orders:write:place", "typo": 1}]}`},
			400, "bad_request", []check{message(`unknown field "commands[1].typo"`)}},

		// Authentication and authorisation.
		{"no token", request{path: "/api/write", body: placeBody(map[string]any{"customer": "A"})},
			401, "unauthorized", []check{header("WWW-Authenticate", "Bearer")}},
		{"garbage token", request{path: "/api/write", token: "not.a.token", body: placeBody(map[string]any{"customer": "A"})},
			401, "unauthorized", nil},
		{"forged token", request{path: "/api/write", token: signed(t, []byte("another-secret-0123456789abcdef!"), claims("t1", later)),
			body: placeBody(map[string]any{"customer": "A"})}, 401, "unauthorized", nil},
		{"alg none token", request{path: "/api/write", token: algNone, body: placeBody(map[string]any{"customer": "A"})},
			401, "unauthorized", nil},
		{"expired token", request{path: "/api/write", token: signed(t, secret, claims("t1", time.Now().Add(-time.Hour))),
			body: placeBody(map[string]any{"customer": "A"})}, 401, "unauthorized", nil},
		{"reserved tenant token", request{path: "/api/write", token: signed(t, secret, claims("system", later)),
			body: placeBody(map[string]any{"customer": "A"})}, 401, "unauthorized", nil},
		{"forged cookie", request{path: "/api/write", cookie: signed(t, []byte("another-secret-0123456789abcdef!"), claims("t1", later)),
			body: placeBody(map[string]any{"customer": "A"})}, 401, "unauthorized", nil},
		// Two Authorization headers: this server would take the first, a
		// proxy or another reader of the request maybe the second.
		{"two Authorization headers", request{path: "/api/write", added: http.Header{"Authorization": {"Bearer " + tok,
			"Bearer " + signed(t, []byte("another-secret-0123456789abcdef!"), claims("t2", later))}},
			body: placeBody(map[string]any{"customer": "A"})}, 401, "unauthorized", []check{message("one Authorization header")}},
		// Two kumiko_auth cookies (a sibling subdomain can add one for a
		// more specific path, which browsers send first): which one counts
		// is up to each reader of the request, as with two headers.
		{"two cookies", request{path: "/api/write", added: http.Header{"Cookie": {auth.CookieName + "=" + signed(t, secret, claims("t2", later)) +
			"; " + auth.CookieName + "=" + tok}},
			body: placeBody(map[string]any{"customer": "A"})}, 401, "unauthorized", []check{message("one " + auth.CookieName + " cookie")}},
		{"two cookie headers", request{path: "/api/write", added: http.Header{"Cookie": {auth.CookieName + "=" + tok,
			auth.CookieName + "=" + signed(t, secret, claims("t2", later))}},
			body: placeBody(map[string]any{"customer": "A"})}, 401, "unauthorized", []check{message("one " + auth.CookieName + " cookie")}},
		{"missing role", request{path: "/api/write", token: tok, body: map[string]any{"type": "web-test:write:admin-only"}},
			403, "access_denied", nil},
		{"missing role in batch", request{path: "/api/batch", token: tok, body: map[string]any{"commands": []any{
			placeBody(map[string]any{"customer": "A"}), map[string]any{"type": "web-test:write:admin-only"},
		}}}, 403, "access_denied", []check{index(1)}},

		// Routing.
		{"unknown route", request{method: http.MethodGet, path: "/nope"}, 404, "not_found", []check{message("/nope")}},
		{"unknown api route", request{path: "/api/nope", token: tok, body: `{}`}, 404, "not_found", nil},
		// The router matches the path as sent: the message repeats that,
		// not the decoded path, which names a route that exists.
		{"percent-encoded route", request{path: "/api/%77rite", token: tok, body: `{}`}, 404, "not_found",
			[]check{message("no route for POST /api/%77rite")}},
		{"wrong method", request{method: http.MethodGet, path: "/api/write", token: tok}, 405, "method_not_allowed",
			[]check{header("Allow", http.MethodPost)}},
		{"wrong method without token", request{method: http.MethodPut, path: "/api/batch", body: `{}`}, 405, "method_not_allowed", nil},
		// Dropped silently, the pair would read as absent.
		{"malformed query escape", request{path: "/api/query?x=%zz", token: tok, body: map[string]any{"type": "orders:query:list"}},
			400, "bad_request", []check{message(`malformed query string: invalid URL escape "%zz"`)}},
		{"semicolon in query", request{path: "/api/write?a=1;b=2", token: tok, body: placeBody(map[string]any{"customer": "A"})},
			400, "bad_request", []check{message("malformed query string")}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := b.do(t, tc.req)
			env := res.requireError(t, tc.status, tc.code)
			for _, c := range tc.checks {
				c(t, res, env)
			}
			b.requireRows(t, 0, 0)
		})
	}
}

// TestCancelOfAnotherTenantsOrder: another tenant's order id is unknown to
// a write as it is to a query (row-level security): cancelling it, alone
// or in a batch, is 404 not_found, and neither the order nor its stream
// changes.
func TestCancelOfAnotherTenantsOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t1, t2 := b.token(t, "t1"), b.token(t, "t2")
	other := b.place(t, t2, "Eve")
	cancel := map[string]any{"type": "orders:write:cancel", "payload": map[string]any{"orderId": other, "expectedVersion": 1}}

	env := b.post(t, "/api/write", t1, cancel).requireError(t, http.StatusNotFound, "not_found")
	require.Contains(t, env.Error.Message, other)
	b.requireRows(t, 1, 1)

	env = b.post(t, "/api/batch", t1, map[string]any{"commands": []any{placeBody(map[string]any{"customer": "Ada"}), cancel}}).
		requireError(t, http.StatusNotFound, "not_found")
	require.InDelta(t, 1, env.Error.Details["index"], 0)
	b.requireRows(t, 1, 1)

	var o orders.Order
	b.post(t, "/api/query", t2, map[string]any{"type": "orders:query:get", "payload": map[string]any{"orderId": other}}).requireData(t, &o)
	require.Equal(t, "placed", o.Status)
	require.Equal(t, int64(1), o.Version)
	var version int64
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT version FROM streams WHERE stream_id = $1`, other).Scan(&version))
	require.Equal(t, int64(1), version)
}

// TestDatabaseDenialIsLoggedAsAWarning: a 403 the database gave (42501,
// a privilege or row-level security refusal) comes from feature code the
// tenant role may not run, such as a table whose migration forgot its
// grants, never from what a client sent alone: the operator sees it at
// warn level with the database's message, the client the plain 403.
func TestDatabaseDenialIsLoggedAsAWarning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "acme")
	r := b.post(t, "/api/write", tok, map[string]any{"type": "web-test:write:denied", "payload": map[string]any{}})
	r.requireError(t, http.StatusForbidden, "access_denied")
	require.NotContains(t, string(r.body), "permission denied")
	lines := b.logs.lines(t, "request denied by the database")
	require.Len(t, lines, 1)
	require.Equal(t, "WARN", lines[0]["level"])
	require.Contains(t, lines[0]["error"], "permission denied for table events")

	// A role missing in the token is the client's: debug, as before.
	r = b.post(t, "/api/write", tok, map[string]any{"type": "web-test:write:admin-only", "payload": map[string]any{}})
	r.requireError(t, http.StatusForbidden, "access_denied")
	require.Len(t, b.logs.lines(t, "request denied by the database"), 1)
}
