package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/admin"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// TestMaintenanceMigrationThatFails: POST /api/admin/migrations/up with a
// migration that fails (here on the data it meets) answers, like the CLI,
// which migration failed and why, and which ones it applied before it,
// instead of the opaque 500 of a server crash; the failed migration left
// nothing behind (goose runs each in its own transaction) and stays pending.
func TestMaintenanceMigrationThatFails(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	set := kumikotest.Migrations(t)
	set["00098_first.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE first_ok (id int);\n-- +goose Down\nDROP TABLE first_ok;\n")}
	set["00099_second.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE half_done (id int);\nALTER TABLE tally ADD COLUMN must_be_set text NOT NULL;\n-- +goose Down\n")}
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO tally VALUES ('acme', 'k', 1)`)
	require.NoError(t, err)

	s := web.New(b.rt, b.keys, nil)
	admin.MountMaintenance(s.Echo(), s.Authenticate, b.db.Pool, b.reg, set)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	other := *b.bundle
	other.url, other.client = srv.URL, srv.Client()

	tok := b.token(t, "admin")
	e := other.do(t, http.MethodPost, "/api/admin/migrations/up", tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "00099_second.sql")
	require.Contains(t, e.Error.Message, "must_be_set")
	require.Equal(t, "migration_failed", e.Error.Details["reason"])
	require.Equal(t, "00099_second.sql", e.Error.Details["failed"].(map[string]any)["name"])
	applied := e.Error.Details["applied"].([]any)
	require.Len(t, applied, 1)
	require.Equal(t, "00098_first.sql", applied[0].(map[string]any)["name"])

	m := decode[migrationsJSON](t, other.do(t, http.MethodGet, "/api/admin/migrations", tok, ""))
	require.Equal(t, 1, m.Pending)
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE tablename = 'half_done'`).Scan(&n))
	require.Zero(t, n, "the failed migration left nothing behind")
}

// TestMaintenanceMigrationCutShortByTheClient: a client that hangs up
// while POST /api/admin/migrations/up runs stops the migration; that is a
// canceled request (logged as such), not a failed migration: it used to be
// answered and logged as 409 "migration_failed", which told the operator
// to fix a migration that had nothing wrong. The migration stays pending.
func TestMaintenanceMigrationCutShortByTheClient(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	set := kumikotest.Migrations(t)
	set["00099_slow.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nSELECT pg_sleep(30);\n-- +goose Down\n")}

	logs := &proctest.Buffer{}
	s := web.New(b.rt, b.keys, &web.Config{Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	admin.MountMaintenance(s.Echo(), s.Authenticate, b.db.Pool, b.reg, set)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/admin/migrations/up", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.token(t, "admin"))
	done := make(chan error, 1)
	go func() {
		res, err := srv.Client().Do(req)
		if err == nil {
			res.Body.Close()
			err = fmt.Errorf("migrations/up answered %d", res.StatusCode)
		}
		done <- err
	}()
	deadline := time.Now().Add(20 * time.Second)
	for b.int(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%pg_sleep(30)%' AND pid <> pg_backend_pid()`) == 0 {
		require.True(t, time.Now().Before(deadline), "the migration does not start")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)

	type line struct {
		Msg  string `json:"msg"`
		Code string `json:"code"`
		Path string `json:"path"`
	}
	var got []line
	for {
		got = got[:0]
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var l line
			require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
			if l.Path == "/api/admin/migrations/up" && l.Msg != "http request" {
				got = append(got, l)
			}
		}
		if len(got) > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the request is not logged; logs:\n%s", logs.String())
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, []line{{Msg: "request canceled", Code: "internal", Path: "/api/admin/migrations/up"}}, got, logs.String())

	sts, err := migrate.List(context.Background(), b.db.Pool, set)
	require.NoError(t, err)
	require.False(t, sts[len(sts)-1].Applied, "the stopped migration stays pending")
}
