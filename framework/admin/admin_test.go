package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/admin"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
)

type noted struct {
	N int `json:"n"`
}

// bundle is a server with the admin API on its own database, whose
// consumer adm:broken is dead (its handler always fails), adm:healthy has
// delivered everything and adm:local is a per-instance consumer of pod-1.
type bundle struct {
	db     *kumikotest.DB
	url    string
	client *http.Client
	keys   *auth.Keyring
	rt     *framework.Runtime
	noted  framework.EventType[noted]
	d      *dispatcher.Dispatcher
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{db: kumikotest.NewDB(t)}
	reg := framework.NewRegistry()
	f := reg.Feature("adm")
	b.noted = framework.DefineEvent[noted](f, "noted", nil)
	noop := func(context.Context, *framework.Tx, framework.Event[noted]) error { return nil }
	framework.On(framework.MultiStreamProjection(f, "healthy", nil), b.noted, noop)
	framework.On(framework.MultiStreamProjection(f, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance}), b.noted, noop)
	framework.On(framework.MultiStreamProjection(f, "broken", &framework.ProjectionOptions{MaxAttempts: 1}), b.noted,
		func(context.Context, *framework.Tx, framework.Event[noted]) error { return errors.New("always broken") })
	var err error
	b.rt, err = framework.NewRuntime(reg, b.db.Pool, nil)
	require.NoError(t, err)
	b.keys, err = auth.NewKeyring([]auth.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	require.NoError(t, err)
	s := web.New(b.rt, b.keys, nil)
	admin.Mount(s.Echo(), s.Authenticate, b.db.Pool)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	b.url, b.client = srv.URL, srv.Client()

	b.d, err = dispatcher.New(b.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{
		InstanceID: "pod-1", RetryBaseDelay: time.Millisecond, RetryMaxDelay: 2 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, b.d.Register(context.Background()))
	b.write(t, 0, 3)
	b.untilStatus(t, "adm:broken", "", dispatcher.StateDead)
	b.catchUp(t, "adm:healthy", "")
	return b
}

// write appends events n = from .. from+count-1 to one stream.
func (b *bundle) write(t *testing.T, from, count int) {
	t.Helper()
	for i := from; i < from+count; i++ {
		_, err := b.rt.InTx(context.Background(), "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: "1"}, framework.AnyVersion, b.noted.With(noted{N: i}))
		})
		require.NoError(t, err)
	}
}

// untilStatus runs passes until the consumer's row has the status.
func (b *bundle) untilStatus(t *testing.T, name, instance string, want dispatcher.State) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := dispatcher.Status(context.Background(), b.db.Pool, name, instance)
		require.NoError(t, err)
		if st.Status == want {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s stays %s, want %s", name, st.Status, want)
		_, err = b.d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		time.Sleep(3 * time.Millisecond)
	}
}

// catchUp runs passes until the consumer has no lag.
func (b *bundle) catchUp(t *testing.T, name, instance string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := dispatcher.Status(context.Background(), b.db.Pool, name, instance)
		require.NoError(t, err)
		if st.Lag == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s keeps lag %d", name, st.Lag)
		_, err = b.d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		time.Sleep(3 * time.Millisecond)
	}
}

func (b *bundle) token(t *testing.T, roles ...string) string {
	t.Helper()
	tok, err := b.keys.Mint(auth.Principal{UserID: "alice", TenantID: "acme", Roles: roles}, time.Hour)
	require.NoError(t, err)
	return tok
}

// envelope is a decoded answer: data or error.
type envelope struct {
	status int
	Data   json.RawMessage `json:"data"`
	Error  *struct {
		Code       string         `json:"code"`
		HTTPStatus int            `json:"httpStatus"`
		Message    string         `json:"message"`
		Details    map[string]any `json:"details"`
		RequestID  string         `json:"requestId"`
	} `json:"error"`
}

func (b *bundle) do(t *testing.T, method, path, token, body string) envelope {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, b.url+path, r)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := b.client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var e envelope
	require.NoError(t, json.Unmarshal(raw, &e), "body: %s", raw)
	e.status = res.StatusCode
	if e.Error != nil {
		require.Equal(t, res.StatusCode, e.Error.HTTPStatus)
		require.NotEmpty(t, e.Error.RequestID)
	}
	return e
}

// requireError asserts an error envelope with status and code.
func requireError(t *testing.T, e envelope, status int, code string) {
	t.Helper()
	require.Equal(t, status, e.status)
	require.NotNil(t, e.Error, "want an error envelope")
	require.Equal(t, code, e.Error.Code)
}

// consumerJSON is the JSON of a dispatcher.ConsumerStatus.
type consumerJSON struct {
	Name                string   `json:"name"`
	InstanceID          string   `json:"instanceId"`
	Status              string   `json:"status"`
	EventTypes          []string `json:"eventTypes"`
	Cursor              string   `json:"cursor"`
	CursorPosition      int64    `json:"cursorPosition"`
	Lag                 int64    `json:"lag"`
	Attempts            int      `json:"attempts"`
	FailedPosition      *int64   `json:"failedPosition"`
	LastError           string   `json:"lastError"`
	DeadSince           *string  `json:"deadSince"`
	EventsProcessed     int64    `json:"eventsProcessed"`
	HeartbeatAgeSeconds float64  `json:"heartbeatAgeSeconds"`
	DeadLetters         []struct {
		Position  int64  `json:"position"`
		EventType string `json:"eventType"`
		TenantID  string `json:"tenantId"`
		Error     string `json:"error"`
	} `json:"deadLetters"`
}

// verbJSON is the data of a verb's answer.
type verbJSON struct {
	Consumer consumerJSON `json:"consumer"`
	Skipped  *struct {
		Position int64  `json:"position"`
		Error    string `json:"error"`
	} `json:"skipped"`
	Rewound *struct {
		From, To                 string
		FromPosition, ToPosition int64
	} `json:"rewound"`
}

func decode[T any](t *testing.T, e envelope) T {
	t.Helper()
	require.Equal(t, http.StatusOK, e.status, "error: %+v", e.Error)
	var v T
	require.NoError(t, json.Unmarshal(e.Data, &v))
	return v
}

func TestAdminRoutesRequireTokenAndAdminRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	routes := []struct{ method, path string }{
		{http.MethodGet, "/api/admin/consumers"},
		{http.MethodGet, "/api/admin/consumers/adm:broken"},
		{http.MethodPost, "/api/admin/consumers/adm:broken/restart"},
		{http.MethodPost, "/api/admin/consumers/adm:broken/skip"},
		{http.MethodPost, "/api/admin/consumers/adm:healthy/disable"},
		{http.MethodPost, "/api/admin/consumers/adm:healthy/enable"},
		{http.MethodPost, "/api/admin/consumers/adm:healthy/rewind"},
		{http.MethodDelete, "/api/admin/instances/pod-1"},
	}
	user := b.token(t, "user")
	for _, r := range routes {
		requireError(t, b.do(t, r.method, r.path, "", ""), http.StatusUnauthorized, "unauthorized")
		requireError(t, b.do(t, r.method, r.path, "not-a-token", ""), http.StatusUnauthorized, "unauthorized")
		e := b.do(t, r.method, r.path, user, `{"toPosition": 0}`)
		requireError(t, e, http.StatusForbidden, "access_denied")
		require.Equal(t, "the admin role is required", e.Error.Message)
	}
	// Nothing changed.
	st, err := dispatcher.Status(context.Background(), b.db.Pool, "adm:broken", "")
	require.NoError(t, err)
	require.Equal(t, dispatcher.StateDead, st.Status)
}

func TestAdminListsConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	list := decode[[]consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers", b.token(t, "admin"), ""))
	require.Len(t, list, 3)
	byName := map[string]consumerJSON{}
	for _, c := range list {
		byName[c.Name+"/"+c.InstanceID] = c
	}
	broken := byName["adm:broken/__shared__"]
	require.Equal(t, "dead", broken.Status)
	require.EqualValues(t, 3, broken.Lag)
	require.Equal(t, 1, broken.Attempts)
	require.NotNil(t, broken.FailedPosition)
	require.Contains(t, broken.LastError, "always broken")
	require.NotNil(t, broken.DeadSince)
	require.Equal(t, "0-0", broken.Cursor)
	healthy := byName["adm:healthy/__shared__"]
	require.Equal(t, "idle", healthy.Status)
	require.Zero(t, healthy.Lag)
	require.EqualValues(t, 3, healthy.EventsProcessed)
	require.True(t, strings.HasSuffix(healthy.Cursor, fmt.Sprintf("-%d", healthy.CursorPosition)), healthy.Cursor)
	require.Equal(t, []string{"adm:event:noted"}, healthy.EventTypes)
	local := byName["adm:local/pod-1"]
	require.Equal(t, "idle", local.Status)
	require.EqualValues(t, 3, local.Lag)
}

func TestAdminShowsOneConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	c := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:broken", tok, ""))
	require.Equal(t, "adm:broken", c.Name)
	require.Equal(t, "dead", c.Status)
	// Escaped names work too.
	c = decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm%3Abroken", tok, ""))
	require.Equal(t, "adm:broken", c.Name)
	c = decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:local?instance=pod-1", tok, ""))
	require.Equal(t, "pod-1", c.InstanceID)

	e := b.do(t, http.MethodGet, "/api/admin/consumers/adm:nope", tok, "")
	requireError(t, e, http.StatusNotFound, "not_found")
	require.Equal(t, "consumer adm:nope not found", e.Error.Message)
	e = b.do(t, http.MethodGet, "/api/admin/consumers/adm:local", tok, "") // no shared row
	requireError(t, e, http.StatusNotFound, "not_found")
}

func TestAdminRestartAndItsRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	v := decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:broken/restart", tok, ""))
	require.Equal(t, "idle", v.Consumer.Status)
	require.Zero(t, v.Consumer.Attempts)
	require.Equal(t, "0-0", v.Consumer.Cursor, "restart keeps the cursor")

	e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:broken/restart", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "consumer adm:broken is idle; restart needs dead", e.Error.Message)
	require.Equal(t, map[string]any{"name": "adm:broken", "instance": "__shared__", "verb": "restart", "status": "idle", "want": "dead"}, e.Error.Details)

	requireError(t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:nope/restart", tok, ""), http.StatusNotFound, "not_found")
}

func TestAdminSkipAndItsRefusal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	before := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:broken", tok, ""))
	v := decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:broken/skip", tok, "{}"))
	require.NotNil(t, v.Skipped)
	require.Equal(t, *before.FailedPosition, v.Skipped.Position)
	require.True(t, strings.HasPrefix(v.Skipped.Error, "skipped by operator"), v.Skipped.Error)
	require.Equal(t, "idle", v.Consumer.Status)
	require.EqualValues(t, 2, v.Consumer.Lag)
	require.Len(t, v.Consumer.DeadLetters, 1)
	require.Equal(t, "acme", v.Consumer.DeadLetters[0].TenantID)

	e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/skip", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "no event after its cursor")
}

func TestAdminDisableEnableAndTheirRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	// Instance from the body.
	v := decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:local/disable", tok, `{"instance":"pod-1"}`))
	require.Equal(t, "disabled", v.Consumer.Status)
	require.Equal(t, "pod-1", v.Consumer.InstanceID)
	e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:local/disable?instance=pod-1", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "consumer adm:local (instance pod-1) is disabled; disable needs idle or dead", e.Error.Message)

	// A disabled consumer gets nothing.
	n, err := b.d.RunOnce(context.Background(), "adm:local")
	require.NoError(t, err)
	require.Zero(t, n)

	// Instance from the query.
	v = decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:local/enable?instance=pod-1", tok, ""))
	require.Equal(t, "idle", v.Consumer.Status)
	e = b.do(t, http.MethodPost, "/api/admin/consumers/adm:local/enable?instance=pod-1", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "consumer adm:local (instance pod-1) is idle; enable needs disabled", e.Error.Message)
	b.catchUp(t, "adm:local", "pod-1")

	// Query and body must agree.
	e = b.do(t, http.MethodPost, "/api/admin/consumers/adm:local/disable?instance=pod-1", tok, `{"instance":"pod-2"}`)
	requireError(t, e, http.StatusBadRequest, "validation_error")
	// The dead consumer can be disabled; enable refuses dead.
	requireError(t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:broken/enable", tok, ""), http.StatusConflict, "conflict")
	v = decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:broken/disable", tok, ""))
	require.Equal(t, "disabled", v.Consumer.Status)
}

func TestAdminRewindAndItsRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	healthy := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:healthy", tok, ""))
	var first int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT position FROM events ORDER BY commit_key, position LIMIT 1`).Scan(&first))

	v := decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, fmt.Sprintf(`{"toPosition": %d}`, first+1)))
	require.NotNil(t, v.Rewound)
	require.Equal(t, healthy.Cursor, v.Rewound.From)
	require.Equal(t, first, v.Rewound.ToPosition)
	require.EqualValues(t, 2, v.Consumer.Lag)

	// Forward is refused; so are unknown positions and bad bodies.
	e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, fmt.Sprintf(`{"toPosition": %d}`, first+2))
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "rewind only moves back")
	requireError(t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, `{"toPosition": 987654}`), http.StatusNotFound, "not_found")
	requireError(t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, `{"toTime": "2999-01-01T00:00:00Z"}`), http.StatusNotFound, "not_found")
	for _, body := range []string{``, `{}`, `{"toPosition": 1, "toTime": "2026-01-01T00:00:00Z"}`, `{"toPosition": -1}`, `{"toTime": "yesterday"}`} {
		e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, body)
		requireError(t, e, http.StatusBadRequest, "validation_error")
		require.NotEmpty(t, e.Error.Details["fields"], body)
	}
	for _, body := range []string{`{"toPosition": "one"}`, `{"to": 1}`, `[1]`, `{"toPosition": 1} x`, `{`} {
		requireError(t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, body), http.StatusBadRequest, "bad_request")
	}
	after := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:healthy", tok, ""))
	require.Equal(t, v.Consumer.Cursor, after.Cursor, "refusals change nothing")

	// To a time: everything was created after the epoch; the dead consumer
	// turns idle.
	v = decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:broken/rewind", tok, `{"toTime": "2000-01-01T00:00:00Z"}`))
	require.Equal(t, "idle", v.Consumer.Status)
	require.Equal(t, "0-0", v.Rewound.From)
	// Position 0: the start of the log.
	v = decode[verbJSON](t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, `{"toPosition": 0}`))
	require.Equal(t, "0-0", v.Rewound.To)
	require.EqualValues(t, 3, v.Consumer.Lag)
}

func TestAdminRemovesASilentInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	e := b.do(t, http.MethodDelete, "/api/admin/instances/pod-1", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "looks alive")
	requireError(t, b.do(t, http.MethodDelete, "/api/admin/instances/pod-9", tok, ""), http.StatusNotFound, "not_found")
	e = b.do(t, http.MethodDelete, "/api/admin/instances/__shared__", tok, "")
	requireError(t, e, http.StatusBadRequest, "validation_error")
	require.Equal(t, "validation failed: the shared instance __shared__ cannot be removed", e.Error.Message)

	_, err := b.db.Pool.Exec(context.Background(), `UPDATE event_consumers SET heartbeat_at = now() - interval '1 hour' WHERE instance_id = 'pod-1'`)
	require.NoError(t, err)
	out := decode[struct {
		Instance string `json:"instance"`
		Removed  int    `json:"removed"`
	}](t, b.do(t, http.MethodDelete, "/api/admin/instances/pod-1", tok, ""))
	require.Equal(t, "pod-1", out.Instance)
	require.Equal(t, 1, out.Removed)
	list := decode[[]consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers", tok, ""))
	require.Len(t, list, 2)
}

func TestAdminPageIsServedWithoutToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for path, ctype := range map[string]string{"/admin": "text/html", "/admin/app.js": "text/javascript"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.url+path, nil)
		require.NoError(t, err)
		res, err := b.client.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.True(t, strings.HasPrefix(res.Header.Get("Content-Type"), ctype))
		require.Equal(t, "no-referrer", res.Header.Get("Referrer-Policy"))
		require.Contains(t, res.Header.Get("Content-Security-Policy"), "script-src 'self'")
		if path == "/admin" {
			require.Contains(t, string(body), `<script src="/admin/app.js"></script>`)
		} else {
			require.Contains(t, string(body), "/api/admin/consumers")
		}
	}
}

// TestAdminRefusesAMalformedQuery: a query string that does not decode
// (a bad %-escape, a semicolon) is 400 bad_request, not read as if the
// parameter were absent: ?instance=%zz must not make a verb act on the
// shared row.
func TestAdminRefusesAMalformedQuery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	before := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:healthy", tok, ""))
	for _, q := range []string{"instance=%zz", "instance=pod-1%", "instance=pod-1;x=1"} {
		e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind?"+q, tok, `{"toPosition": 0}`)
		requireError(t, e, http.StatusBadRequest, "bad_request")
		require.Contains(t, e.Error.Message, "query", q)
		requireError(t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:healthy?"+q, tok, ""), http.StatusBadRequest, "bad_request")
	}
	after := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:healthy", tok, ""))
	require.Equal(t, before.Cursor, after.Cursor, "the shared row was not rewound")
}

// TestAdminVerbsRefuseARewindTarget: only rewind takes toPosition or
// toTime. Heeded by no other verb, such a field must not pass unnoticed:
// skip {"toPosition": N} would skip the failing event, not move to N.
func TestAdminVerbsRefuseARewindTarget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	before := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:broken", tok, ""))
	require.Equal(t, "dead", before.Status)
	for _, verb := range []string{"restart", "skip", "disable", "enable"} {
		for field, body := range map[string]string{"toPosition": `{"toPosition": 1}`, "toTime": `{"toTime": "2000-01-01T00:00:00Z"}`} {
			e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:broken/"+verb, tok, body)
			requireError(t, e, http.StatusBadRequest, "validation_error")
			require.Contains(t, e.Error.Message, field, verb)
		}
	}
	after := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:broken", tok, ""))
	require.Equal(t, before.Status, after.Status)
	require.Equal(t, before.Cursor, after.Cursor)
	require.Equal(t, before.FailedPosition, after.FailedPosition)
}

// The SSE consumer's verbs that would take events from its process's live
// streams are refused with a conflict that says what to do instead.
func TestAdminRefusesVerbsThatStarveLiveStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	_, err := b.db.Pool.Exec(context.Background(),
		`INSERT INTO event_consumers (name, instance_id) VALUES ($1, 'api-1')`, dispatcher.SSEConsumerName)
	require.NoError(t, err)
	e := b.do(t, http.MethodPost, "/api/admin/consumers/"+dispatcher.SSEConsumerName+"/skip?instance=api-1", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "feeds the live SSE streams of its process and is not failing at an event")
	e = b.do(t, http.MethodPost, "/api/admin/consumers/"+dispatcher.SSEConsumerName+"/disable", tok, `{"instance":"api-1"}`)
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "drain or stop that process")
}
