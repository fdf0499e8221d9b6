package sse_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/framework/web"
)

// wait is the deadline of every "eventually" in these tests: the visibility
// horizon is cluster-wide, so other tests' transactions delay delivery.
const wait = 30 * time.Second

// Noted is the payload of sse-test:event:noted.
type Noted struct {
	N    int    `json:"n"`
	Text string `json:"text"`
}

// bundle is one hub, fed by its dispatcher, behind one HTTP server, on a
// fresh database.
type bundle struct {
	db      *kumikotest.DB
	pool    *pgxpool.Pool // the runtime's, hub's and dispatcher's
	inst    string        // the dispatcher's instance id
	reg     *framework.Registry
	rt      *framework.Runtime
	hub     *sse.Hub
	noted   framework.EventType[Noted]
	keys    *auth.Keyring
	url     string
	metrics *prometheus.Registry
}

// setup builds the bundle; cfg tunes the hub (nil: defaults).
func setup(t *testing.T, cfg *sse.Config) *bundle {
	t.Helper()
	return setupWith(t, cfg, nil)
}

// setupWith is setup that lets register declare more on the registry.
func setupWith(t *testing.T, cfg *sse.Config, register func(reg *framework.Registry)) *bundle {
	t.Helper()
	return setupPool(t, cfg, register, 0)
}

// setupPool is setupWith whose runtime, hub and dispatcher share a pool of
// maxConns connections (0: the test database's pool, the default size).
func setupPool(t *testing.T, cfg *sse.Config, register func(reg *framework.Registry), maxConns int32) *bundle {
	t.Helper()
	b := &bundle{db: kumikotest.NewDB(t), reg: framework.NewRegistry(), metrics: prometheus.NewRegistry()}
	b.pool = b.db.Pool
	if maxConns > 0 {
		pc, err := pgxpool.ParseConfig(b.db.URL)
		require.NoError(t, err)
		pc.MaxConns = maxConns
		b.pool, err = pgxpool.NewWithConfig(context.Background(), pc)
		require.NoError(t, err)
		t.Cleanup(b.pool.Close)
	}
	orders.Register(b.reg)
	b.noted = framework.DefineEvent[Noted](b.reg.Feature("sse-test"), "noted", nil)
	if register != nil {
		register(b.reg)
	}
	require.NoError(t, b.reg.Build())
	var err error
	b.rt, err = framework.NewRuntime(b.reg, b.pool, nil)
	require.NoError(t, err)
	c := sse.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.Metrics = b.metrics
	b.hub, err = sse.New(b.pool, b.reg, &c)
	require.NoError(t, err)
	inst := "sse-test-" + uuid.NewString()[:8]
	b.inst = inst
	d, err := dispatcher.New(b.pool, b.reg, []dispatcher.Consumer{b.hub.Consumer()},
		&dispatcher.Config{InstanceID: inst, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	b.rt.OnCommit(func(int) { d.Wake() })
	require.NoError(t, b.hub.Prime(context.Background(), inst))

	b.keys, err = auth.NewKeyring([]auth.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	require.NoError(t, err)
	s := web.New(b.rt, b.keys, nil)
	b.hub.Mount(s)
	srv := httptest.NewServer(s.Handler())
	b.url = srv.URL

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.Run(ctx)
	}()
	t.Cleanup(func() {
		b.hub.Close()
		srv.Close()
		cancel()
		<-done
	})
	return b
}

// token mints a token of user "u-<tenant>" of tenant.
func (b *bundle) token(t *testing.T, tenant string) string {
	t.Helper()
	tok, err := b.keys.Mint(auth.Principal{UserID: "u-" + tenant, TenantID: tenant}, time.Hour)
	require.NoError(t, err)
	return tok
}

// note appends one sse-test:event:noted to stream kind/id of tenant.
func (b *bundle) note(t *testing.T, tenant, kind string, n int, text string) {
	t.Helper()
	_, err := b.rt.InTx(context.Background(), tenant, framework.Metadata{CorrelationID: fmt.Sprintf("corr-%d", n)},
		func(_ context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: kind, ID: uuid.NewString()}, framework.NoStream, b.noted.With(Noted{N: n, Text: text}))
		})
	require.NoError(t, err)
}

// place runs orders:write:place for tenant.
func (b *bundle) place(t *testing.T, tenant, customer string) {
	t.Helper()
	_, err := b.rt.Write(context.Background(), framework.Call{Principal: auth.Principal{UserID: "u", TenantID: tenant}, RequestID: uuid.NewString()},
		[]framework.Command{{Type: "orders:write:place", Payload: []byte(fmt.Sprintf(`{"customer":%q,"amountCents":100}`, customer))}})
	require.NoError(t, err)
}

// logOf returns the cursors of tenant's events, in delivery order.
func (b *bundle) logOf(t *testing.T, tenant string) []string {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(),
		`SELECT commit_key::text || '-' || position FROM events WHERE tenant_id = $1 ORDER BY commit_key, position`, tenant)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// client is one open stream, read in the background.
type client struct {
	resp   *http.Response
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	open   sse.Open // the opening frame's data
	events []sse.Event
	err    error
}

// readOpen reads a stream's first frame, which must be the opening frame
// (sse.OpenEvent, no id, a valid consistency token), and returns its data.
func readOpen(rd *sse.Reader) (sse.Open, error) {
	ev, err := rd.Next()
	if err != nil {
		return sse.Open{}, err
	}
	var o sse.Open
	if ev.Type != sse.OpenEvent || ev.ID != "" {
		return o, fmt.Errorf("the stream's first frame is %s (id %q), not the opening frame", ev.Type, ev.ID)
	}
	if err := json.Unmarshal(ev.Data, &o); err != nil || !framework.ValidConsistencyToken(o.ConsistencyToken) {
		return o, fmt.Errorf("opening frame %s: no consistency token", ev.Data)
	}
	return o, nil
}

// requireOpen is readOpen for the test's goroutine.
func requireOpen(t *testing.T, rd *sse.Reader) sse.Open {
	t.Helper()
	o, err := readOpen(rd)
	require.NoError(t, err)
	return o
}

// request describes a stream request.
type request struct {
	tenant  string // "" sends no token
	query   string
	lastID  string // sent as Last-Event-ID
	queryID string // sent as ?lastEventId=
	token   string // sent instead of a fresh token of tenant
}

func (b *bundle) newRequest(t *testing.T, ctx context.Context, r request) *http.Request {
	t.Helper()
	u := b.url + sse.Path + "?" + r.query
	if r.queryID != "" {
		u += "&lastEventId=" + r.queryID
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	require.NoError(t, err)
	switch {
	case r.token != "":
		req.Header.Set("Authorization", "Bearer "+r.token)
	case r.tenant != "":
		req.Header.Set("Authorization", "Bearer "+b.token(t, r.tenant))
	}
	if r.lastID != "" {
		req.Header.Set(sse.HeaderLastEventID, r.lastID)
	}
	return req
}

// connect opens a stream and reads it in the background; it fails the test
// unless the answer is 200.
func (b *bundle) connect(t *testing.T, r request) *client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, r))
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("stream answered %d: %s", resp.StatusCode, body)
	}
	require.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	c := &client{resp: resp, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		rd := sse.NewReader(resp.Body)
		open, err := readOpen(rd)
		c.mu.Lock()
		c.open, c.err = open, err
		c.mu.Unlock()
		if err != nil {
			return
		}
		for {
			ev, err := rd.Next()
			c.mu.Lock()
			if err != nil {
				c.err = err
				c.mu.Unlock()
				return
			}
			c.events = append(c.events, ev)
			c.mu.Unlock()
		}
	}()
	t.Cleanup(c.close)
	return c
}

// close ends the stream from the client side and waits for the reader.
func (c *client) close() {
	c.cancel()
	c.resp.Body.Close()
	<-c.done
}

// snapshot returns the events read so far.
func (c *client) snapshot() []sse.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sse.Event(nil), c.events...)
}

// waitFor waits until the client has read at least n events.
func (c *client) waitFor(t *testing.T, n int) []sse.Event {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		evs := c.snapshot()
		if len(evs) >= n {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("got %d events, want %d", len(evs), n)
		}
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		if err != nil {
			t.Fatalf("stream ended after %d events (want %d): %v", len(evs), n, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ids returns the frame ids.
func ids(evs []sse.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// status sends a stream request and returns the status and body of a
// non-streaming answer.
func (b *bundle) status(t *testing.T, r request) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, r))
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return resp.StatusCode, ""
	}
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// gauge reads a metric's value from the bundle's registry.
func (b *bundle) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := b.metrics.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if g := m.GetGauge(); g != nil {
			return g.GetValue()
		}
		return m.GetCounter().GetValue()
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ = errors.Is
var _ = strings.Contains
var _ = eventstore.ParseCursor

// dialResume opens a raw stream of the token's caller resuming after
// lastID, from a socket with a small receive buffer (set before connecting,
// so that the window is small from the start: shrinking it later stalls
// TCP). The request is sent; the caller reads the response off the
// connection, or leaves it unread so that the replay blocks in a write.
func (b *bundle) dialResume(t *testing.T, token, lastID string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return cmp.Or(err, serr)
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer %s\r\n%s: %s\r\n\r\n",
		sse.Path, token, sse.HeaderLastEventID, lastID)
	require.NoError(t, err)
	return conn
}

// memoBacklog appends n notes of tenant's (N 0 to n-1) in one transaction
// to streams of their own, waits until the hub is past them, and returns
// the tenant's log.
func (b *bundle) memoBacklog(t *testing.T, tenant string, n int) []string {
	t.Helper()
	_, err := b.rt.InTx(context.Background(), tenant, framework.Metadata{CorrelationID: "backlog"}, func(_ context.Context, tx *framework.Tx) error {
		for i := range n {
			if err := tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream, b.noted.With(Noted{N: i})); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	log := b.logOf(t, tenant)
	end, err := sse.ParseEventID(log[len(log)-1])
	require.NoError(t, err)
	eventually(t, "hub past the backlog", func() bool { return !b.hub.Position().Less(end) })
	return log
}

// holdReplayReads locks event_prune_marks, which every resume check and
// replay page reads and no write touches, so that those reads wait; it
// returns the lock's release.
func (b *bundle) holdReplayReads(t *testing.T) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `LOCK TABLE event_prune_marks IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	return func() { _ = tx.Rollback(ctx) }
}

// replayReadsWaiting counts the reads waiting for holdReplayReads' lock.
func (b *bundle) replayReadsWaiting(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_locks WHERE relation = 'event_prune_marks'::regclass AND NOT granted`).Scan(&n))
	return n
}
