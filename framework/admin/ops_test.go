package admin_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/admin"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/rebuild"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/migrations"
)

type tallied struct {
	Key string `json:"key"`
	N   int    `json:"n"`
}

// opsBundle is a server with the maintenance routes on its own database:
// the pub/sub type ops:event:ping read by the side-effect-only projection
// ops:pinger, and the aggregate type ops:event:counted read by ops:tally,
// which owns the table tally.
type opsBundle struct {
	*bundle
	reg     *framework.Registry
	ping    framework.EventType[tallied]
	counted framework.EventType[tallied]
	// slow makes the tally handler sleep on every event.
	slow atomic.Bool
}

func setupOps(t *testing.T) *opsBundle {
	t.Helper()
	b := &opsBundle{bundle: &bundle{db: kumikotest.NewDB(t)}, reg: framework.NewRegistry()}
	_, err := b.db.Pool.Exec(context.Background(), `
		CREATE TABLE tally (tenant_id text NOT NULL, key text NOT NULL, total bigint NOT NULL, PRIMARY KEY (tenant_id, key));
		SELECT kumiko_enable_tenancy('tally')`)
	require.NoError(t, err)
	f := b.reg.Feature("ops")
	b.ping = framework.DefineEvent[tallied](f, "ping", &framework.EventOptions{PubSub: true})
	b.counted = framework.DefineEvent[tallied](f, "counted", nil)
	framework.On(framework.MultiStreamProjection(f, "pinger", nil), b.ping,
		func(context.Context, *framework.Tx, framework.Event[tallied]) error { return nil })
	tally := framework.MultiStreamProjection(f, "tally", &framework.ProjectionOptions{Table: "tally"})
	framework.On(tally, b.counted, func(ctx context.Context, tx *framework.Tx, e framework.Event[tallied]) error {
		if b.slow.Load() {
			time.Sleep(20 * time.Millisecond)
		}
		if e.Payload.Key == "poison" {
			return errors.New("tally: poison key")
		}
		_, err := tx.Exec(ctx, `INSERT INTO tally AS t (tenant_id, key, total) VALUES ($1, $2, $3)
			ON CONFLICT (tenant_id, key) DO UPDATE SET total = t.total + EXCLUDED.total`, e.TenantID, e.Payload.Key, e.Payload.N)
		return err
	})
	b.rt, err = framework.NewRuntime(b.reg, b.db.Pool, nil)
	require.NoError(t, err)
	b.keys = newKeyring(t)
	s := web.New(b.rt, b.keys, nil)
	admin.MountMaintenance(s.Echo(), s.Authenticate, b.db.Pool, b.reg, nil)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	b.url, b.client = srv.URL, srv.Client()
	b.d, err = dispatcher.New(b.db.Pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), &dispatcher.Config{InstanceID: "pod-1"})
	require.NoError(t, err)
	require.NoError(t, b.d.Register(context.Background()))
	return b
}

// append writes count events of ev (n = 1 .. count, key k) in one
// transaction.
func (b *opsBundle) append(t *testing.T, ev framework.EventType[tallied], key string, count int) {
	t.Helper()
	_, err := b.rt.InTx(context.Background(), "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		evs := make([]framework.PendingEvent, 0, count)
		for n := 1; n <= count; n++ {
			evs = append(evs, ev.With(tallied{Key: key, N: n}))
		}
		return tx.Append(framework.Stream{Type: "s", ID: key}, framework.AnyVersion, evs...)
	})
	require.NoError(t, err)
}

func (b *opsBundle) int(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (b *opsBundle) events(t *testing.T, typ string) int64 {
	t.Helper()
	return b.int(t, `SELECT count(*) FROM events WHERE type = $1`, typ)
}

// drain runs passes until the consumer has no lag.
func (b *opsBundle) drain(t *testing.T, name string) {
	t.Helper()
	b.db.WaitVisible(t)
	b.catchUp(t, name, "")
}

// leftovers counts what a rebuild leaves behind.
func (b *opsBundle) leftovers(t *testing.T) int64 {
	t.Helper()
	return b.int(t, `SELECT (SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%')
		+ (SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild')`)
}

type migrationsJSON struct {
	Migrations []struct {
		Version int64  `json:"version"`
		Name    string `json:"name"`
		State   string `json:"state"`
	} `json:"migrations"`
	Pending int `json:"pending"`
}

type pruneJSON struct {
	OlderThanDays int              `json:"olderThanDays"`
	Cutoff        *time.Time       `json:"cutoff"`
	Types         []string         `json:"types"`
	Counts        map[string]int64 `json:"counts"`
	Total         int64            `json:"total"`
	DryRun        bool             `json:"dryRun"`
}

type rebuildJSON struct {
	Projection     string `json:"projection"`
	Table          string `json:"table"`
	Events         int64  `json:"events"`
	Cursor         string `json:"cursor"`
	CursorPosition int64  `json:"cursorPosition"`
	Leftover       bool   `json:"leftover"`
	Removed        *bool  `json:"removed"`
}

func TestMaintenanceRoutesRequireTokenAndAdminRole(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	b.append(t, b.ping, "p", 2)
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE events SET created_at = now() - interval '40 days'`)
	require.NoError(t, err)
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "ops:pinger", ""))
	routes := []struct{ method, path, body string }{
		{http.MethodGet, "/api/admin/migrations", ""},
		{http.MethodPost, "/api/admin/migrations/up", ""},
		{http.MethodPost, "/api/admin/events/prune", `{"olderThanDays": 30}`},
		{http.MethodPost, "/api/admin/projections/ops:tally/rebuild", ""},
	}
	user := b.token(t, "user")
	for _, r := range routes {
		requireError(t, b.do(t, r.method, r.path, "", r.body), http.StatusUnauthorized, "unauthorized")
		requireError(t, b.do(t, r.method, r.path, "not-a-token", r.body), http.StatusUnauthorized, "unauthorized")
		e := b.do(t, r.method, r.path, user, r.body)
		requireError(t, e, http.StatusForbidden, "access_denied")
		require.Equal(t, "the admin role is required", e.Error.Message)
	}
	require.EqualValues(t, 2, b.events(t, "ops:event:ping"), "nothing pruned")
	require.Zero(t, b.leftovers(t))
}

func TestMaintenanceMigrations(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	m := decode[migrationsJSON](t, b.do(t, http.MethodGet, "/api/admin/migrations", tok, ""))
	require.NotEmpty(t, m.Migrations)
	require.Zero(t, m.Pending)
	last := m.Migrations[len(m.Migrations)-1]
	for _, s := range m.Migrations {
		require.Equal(t, "applied", s.State, s.Name)
	}
	require.True(t, strings.HasSuffix(last.Name, ".sql"), last.Name)

	// Roll the newest migration back: it is pending again.
	db := stdlib.OpenDBFromPool(b.db.Pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	require.NoError(t, err)
	_, err = p.Down(context.Background())
	require.NoError(t, err)
	m = decode[migrationsJSON](t, b.do(t, http.MethodGet, "/api/admin/migrations", tok, ""))
	require.Equal(t, 1, m.Pending)
	require.Equal(t, "pending", m.Migrations[len(m.Migrations)-1].State)

	// A bad body applies nothing.
	requireError(t, b.do(t, http.MethodPost, "/api/admin/migrations/up", tok, `{"version": 1}`), http.StatusBadRequest, "bad_request")
	m = decode[migrationsJSON](t, b.do(t, http.MethodGet, "/api/admin/migrations", tok, ""))
	require.Equal(t, 1, m.Pending)

	type upJSON struct {
		Applied []struct {
			Version int64  `json:"version"`
			Name    string `json:"name"`
			State   string `json:"state"`
		} `json:"applied"`
		Count int `json:"count"`
	}
	up := decode[upJSON](t, b.do(t, http.MethodPost, "/api/admin/migrations/up", tok, ""))
	require.Equal(t, 1, up.Count)
	require.Len(t, up.Applied, 1)
	require.Equal(t, last.Version, up.Applied[0].Version)
	require.Equal(t, last.Name, up.Applied[0].Name)
	require.Equal(t, "applied", up.Applied[0].State)
	m = decode[migrationsJSON](t, b.do(t, http.MethodGet, "/api/admin/migrations", tok, ""))
	require.Zero(t, m.Pending)
	up = decode[upJSON](t, b.do(t, http.MethodPost, "/api/admin/migrations/up", tok, "{}"))
	require.Zero(t, up.Count)
	require.Empty(t, up.Applied)
}

func TestMaintenancePrune(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	b.append(t, b.ping, "p", 3)
	b.append(t, b.counted, "c", 2)
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE events SET created_at = now() - interval '40 days'`)
	require.NoError(t, err)
	b.append(t, b.ping, "fresh", 1)
	const prune = "/api/admin/events/prune"
	unchanged := func() {
		t.Helper()
		require.EqualValues(t, 4, b.events(t, "ops:event:ping"))
		require.EqualValues(t, 2, b.events(t, "ops:event:counted"))
	}

	// Bad input deletes nothing.
	for body, msg := range map[string]string{
		``:                                     "olderThanDays is required",
		`{}`:                                   "olderThanDays is required",
		`{"types": ["ops:event:ping"]}`:        "olderThanDays is required",
		`{"olderThanDays": 0}`:                 "olderThanDays must be between 1 and 1000000",
		`{"olderThanDays": -5}`:                "olderThanDays must be between 1 and 1000000",
		`{"olderThanDays": 1000001}`:           "olderThanDays must be between 1 and 1000000",
		`{"olderThanDays": 30, "types": []}`:   "types names no event type",
		`{"olderThanDays": 30, "types": null}`: "types names no event type",
		`{"olderThanDays": 30, "types": [" ", ""]}`:          "types names no event type",
		`{"olderThanDays": 30, "types": ["ops:event:nope"]}`: "retention: unknown event type: ops:event:nope (declared: ",
	} {
		e := b.do(t, http.MethodPost, prune, tok, body)
		require.Equal(t, http.StatusBadRequest, e.status, "%s: %+v", body, e.Error)
		requireError(t, e, http.StatusBadRequest, "validation_error")
		require.Contains(t, e.Error.Message, msg, body)
		require.NotEmpty(t, e.Error.Details["fields"], body)
	}
	for _, body := range []string{`{"olderThanDays": 30, "dry_run": true}`, `{"olderThanDays": "30"}`,
		`{"olderThanDays": 30, "types": "ops:event:ping"}`, `[30]`, `{"olderThanDays": 30} {}`} {
		e := b.do(t, http.MethodPost, prune, tok, body)
		requireError(t, e, http.StatusBadRequest, "bad_request")
		require.NotEmpty(t, e.Error.Message)
	}
	unchanged()

	// The consumer check refuses, in a dry run with the counts too.
	e := b.do(t, http.MethodPost, prune, tok, `{"olderThanDays": 30}`)
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "retention: refused: consumers have not passed the events to prune:\n  ops:pinger (instance __shared__, idle, cursor 0-0): 3 unseen")
	require.Contains(t, e.Error.Message, "kumiko consumer skip NAME")
	require.Equal(t, "consumers_behind", e.Error.Details["reason"])
	require.Equal(t, []any{map[string]any{"name": "ops:pinger", "instance": "__shared__", "status": "idle", "cursor": "0-0", "unseen": float64(3)}},
		e.Error.Details["consumers"])
	require.NotContains(t, e.Error.Details, "dryRun")
	e = b.do(t, http.MethodPost, prune, tok, `{"olderThanDays": 30, "dryRun": true}`)
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, map[string]any{"ops:event:ping": float64(3)}, e.Error.Details["dryRun"].(map[string]any)["counts"])
	unchanged()

	// Another prune running.
	conn, err := b.db.Pool.Acquire(context.Background())
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), `SELECT pg_advisory_lock(hashtextextended('kumiko-events-prune', 0))`)
	require.NoError(t, err)
	e = b.do(t, http.MethodPost, prune, tok, `{"olderThanDays": 30}`)
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "retention: another prune is running", e.Error.Message)
	require.Equal(t, map[string]any{"reason": "prune_running"}, e.Error.Details)
	_, err = conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtextextended('kumiko-events-prune', 0))`)
	require.NoError(t, err)
	conn.Release()
	unchanged()

	// Once the consumers passed them: a dry run counts, a prune deletes.
	b.drain(t, "ops:pinger")
	res := decode[pruneJSON](t, b.do(t, http.MethodPost, prune, tok, `{"olderThanDays": 30, "dryRun": true}`))
	require.True(t, res.DryRun)
	require.Equal(t, []string{"ops:event:ping"}, res.Types)
	require.Equal(t, map[string]int64{"ops:event:ping": 3}, res.Counts)
	require.EqualValues(t, 3, res.Total)
	require.Equal(t, 30, res.OlderThanDays)
	require.NotNil(t, res.Cutoff)
	require.WithinDuration(t, time.Now().Add(-30*24*time.Hour), *res.Cutoff, time.Minute)
	unchanged()
	// The largest age the route accepts puts the cutoff before year 0,
	// which encoding/json cannot write as a time: it used to answer 500
	// (after a real prune had run).
	e = b.do(t, http.MethodPost, prune, tok, `{"olderThanDays": 1000000, "dryRun": true}`)
	require.Equal(t, http.StatusOK, e.status, "%+v", e.Error)
	far := decode[map[string]any](t, e)
	require.Regexp(t, `^-\d{4}-\d\d-\d\dT`, far["cutoff"])
	require.EqualValues(t, 0, far["total"])
	unchanged()
	res = decode[pruneJSON](t, b.do(t, http.MethodPost, prune, tok, `{"olderThanDays": 30}`))
	require.False(t, res.DryRun)
	require.EqualValues(t, 3, res.Total)
	require.EqualValues(t, 1, b.events(t, "ops:event:ping"), "the fresh event stays")
	require.EqualValues(t, 2, b.events(t, "ops:event:counted"), "aggregate events stay unless named")

	// Aggregate events go when named.
	b.drain(t, "ops:tally")
	res = decode[pruneJSON](t, b.do(t, http.MethodPost, prune, tok, `{"olderThanDays": 30, "types": ["ops:event:counted", "ops:event:counted"]}`))
	require.Equal(t, []string{"ops:event:counted"}, res.Types)
	require.EqualValues(t, 2, res.Total)
	require.Zero(t, b.events(t, "ops:event:counted"))
}

func TestMaintenanceRebuild(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	b.append(t, b.counted, "a", 5)
	b.append(t, b.counted, "b", 3)
	b.drain(t, "ops:tally")
	// A row the events do not explain: the rebuild drops it.
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO tally VALUES ('acme', 'stray', 99)`)
	require.NoError(t, err)
	const path = "/api/admin/projections/ops%3Atally/rebuild"

	// Refusals change nothing.
	e := b.do(t, http.MethodPost, "/api/admin/projections/ops:nope/rebuild", tok, "")
	requireError(t, e, http.StatusNotFound, "not_found")
	require.Equal(t, `rebuild: unknown projection "ops:nope" (projections with a table: ops:tally)`, e.Error.Message)
	e = b.do(t, http.MethodPost, "/api/admin/projections/ops:pinger/rebuild", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "rebuild: projection cannot be rebuilt: ops:pinger is side-effect-only (no Table): its effects cannot be redone into a fresh table", e.Error.Message)
	require.Equal(t, map[string]any{"projection": "ops:pinger", "reason": "not_rebuildable"}, e.Error.Details)
	// A huge batchSize used to panic in the rebuild (or, at 1e9, kill the
	// process with out of memory), leaving the shadow schema behind.
	for _, body := range []string{`{"batchSize": 0}`, `{"batchSize": -1}`, `{"batchSize": 2, "abandon": true}`,
		`{"batchSize": 10001}`, `{"batchSize": 4611686018427387904}`} {
		requireError(t, b.do(t, http.MethodPost, path, tok, body), http.StatusBadRequest, "validation_error")
	}
	for _, body := range []string{`{"batch": 2}`, `{"batchSize": "2"}`, `{"abandon": 1}`} {
		requireError(t, b.do(t, http.MethodPost, path, tok, body), http.StatusBadRequest, "bad_request")
	}
	conn, err := b.db.Pool.Acquire(context.Background())
	require.NoError(t, err)
	lock := `SELECT pg_advisory_lock(hashtextextended('kumiko-rebuild' || chr(31) || 'ops:tally', 0))`
	_, err = conn.Exec(context.Background(), lock)
	require.NoError(t, err)
	e = b.do(t, http.MethodPost, path, tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "rebuild: a rebuild of this projection is already running: ops:tally", e.Error.Message)
	require.Equal(t, "rebuild_running", e.Error.Details["reason"])
	requireError(t, b.do(t, http.MethodPost, path, tok, `{"abandon": true}`), http.StatusConflict, "conflict")
	_, err = conn.Exec(context.Background(), strings.Replace(lock, "pg_advisory_lock", "pg_advisory_unlock", 1))
	require.NoError(t, err)
	conn.Release()
	require.EqualValues(t, 1, b.int(t, `SELECT count(*) FROM tally WHERE key = 'stray'`))
	require.Zero(t, b.leftovers(t))

	res := decode[rebuildJSON](t, b.do(t, http.MethodPost, path, tok, `{"batchSize": 2}`))
	require.Equal(t, "ops:tally", res.Projection)
	require.Equal(t, `"public"."tally"`, res.Table)
	require.EqualValues(t, 8, res.Events)
	require.False(t, res.Leftover)
	st, err := dispatcher.Status(context.Background(), b.db.Pool, "ops:tally", "")
	require.NoError(t, err)
	require.Equal(t, st.Cursor.String(), res.Cursor)
	require.Equal(t, st.Cursor.Position, res.CursorPosition)
	require.Zero(t, b.int(t, `SELECT count(*) FROM tally WHERE key = 'stray'`))
	require.EqualValues(t, 15, b.int(t, `SELECT total FROM tally WHERE key = 'a'`))
	require.EqualValues(t, 6, b.int(t, `SELECT total FROM tally WHERE key = 'b'`))
	require.Zero(t, b.leftovers(t))

	// Abandon removes a leftover, and says when there was none.
	_, err = b.db.Pool.Exec(context.Background(), `CREATE SCHEMA `+pgx.Identifier{rebuild.ShadowSchema("ops:tally")}.Sanitize())
	require.NoError(t, err)
	res = decode[rebuildJSON](t, b.do(t, http.MethodPost, path, tok, `{"abandon": true}`))
	require.NotNil(t, res.Removed)
	require.True(t, *res.Removed)
	require.Zero(t, b.leftovers(t))
	res = decode[rebuildJSON](t, b.do(t, http.MethodPost, path, tok, `{"abandon": true}`))
	require.False(t, *res.Removed)
	require.EqualValues(t, 15, b.int(t, `SELECT total FROM tally WHERE key = 'a'`), "abandon leaves the table")

	// The leftover of a projection the code no longer declares (removed or
	// renamed since its rebuild was killed) pins retention: abandon removes
	// it too, while a rebuild of that name is still a 404.
	_, err = b.db.Pool.Exec(context.Background(), `CREATE SCHEMA `+pgx.Identifier{rebuild.ShadowSchema("ops:gone")}.Sanitize()+`;
		INSERT INTO event_consumers (name, instance_id) VALUES ('ops:gone#rebuild', '__shared__')`)
	require.NoError(t, err)
	res = decode[rebuildJSON](t, b.do(t, http.MethodPost, "/api/admin/projections/ops:gone/rebuild", tok, `{"abandon": true}`))
	require.True(t, *res.Removed)
	require.Zero(t, b.leftovers(t))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name = 'ops:gone#rebuild'`))
	requireError(t, b.do(t, http.MethodPost, "/api/admin/projections/ops:gone/rebuild", tok, ""), http.StatusNotFound, "not_found")
}

// A rebuild whose handler fails on an event answers 409 conflict with the
// failing event and its error (what the CLI prints), not an opaque 500
// "internal error" that leaves the operator with the server log; the live
// table stays and nothing is left behind.
func TestMaintenanceRebuildOfAFailingHandler(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	b.append(t, b.counted, "a", 2)
	b.append(t, b.counted, "poison", 1)
	pos := b.int(t, `SELECT position FROM events WHERE stream_id = 'poison'`)
	// The rebuild replays what lies below the visibility horizon; other
	// tests' transactions on the server hold it back for a moment.
	b.db.WaitVisible(t)

	e := b.do(t, http.MethodPost, "/api/admin/projections/ops:tally/rebuild", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	want := fmt.Sprintf("rebuild: ops:tally failed at event %d after ", pos)
	require.True(t, strings.HasPrefix(e.Error.Message, want), e.Error.Message)
	require.Contains(t, e.Error.Message, "tally: poison key")
	require.Equal(t, "ops:tally", e.Error.Details["projection"])
	require.Equal(t, "event_failed", e.Error.Details["reason"])
	require.EqualValues(t, pos, e.Error.Details["position"])
	require.Contains(t, e.Error.Details["error"], "tally: poison key")
	require.Zero(t, b.leftovers(t))
}

// A client that goes away cancels the rebuild, which removes what it built
// and leaves the live table alone.
func TestMaintenanceRebuildCancelledByTheClient(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	b.append(t, b.counted, "a", 200)
	b.drain(t, "ops:tally")
	oid := b.int(t, `SELECT 'tally'::regclass::oid::bigint`)
	b.slow.Store(true)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/api/admin/projections/ops:tally/rebuild",
		strings.NewReader(`{"batchSize": 1}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	done := make(chan error, 1)
	go func() {
		res, err := b.client.Do(req)
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("the rebuild answered %d", res.StatusCode)
		}
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for b.int(t, `SELECT coalesce(sum(events_processed), 0) FROM event_consumers WHERE name = 'ops:tally#rebuild'`) < 2 {
		require.True(t, time.Now().Before(deadline), "the rebuild does not start")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	for b.leftovers(t) > 0 {
		require.True(t, time.Now().Before(deadline), "the cancelled rebuild leaves its shadow table")
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, oid, b.int(t, `SELECT 'tally'::regclass::oid::bigint`), "the live table stays")
	require.EqualValues(t, 200*201/2, b.int(t, `SELECT total FROM tally WHERE key = 'a'`))

	// The lock is free again once the cleanup ended.
	b.slow.Store(false)
	for {
		e := b.do(t, http.MethodPost, "/api/admin/projections/ops:tally/rebuild", tok, "")
		if e.status == http.StatusConflict && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		res := decode[rebuildJSON](t, e)
		require.EqualValues(t, 200, res.Events)
		break
	}
}

func newKeyring(t *testing.T) *auth.Keyring {
	t.Helper()
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	require.NoError(t, err)
	return keys
}
