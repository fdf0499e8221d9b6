package admin_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/admin"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// TestMaintenanceMigrateSaysItWaitsForTheLock: POST
// /api/admin/migrations/up that finds the migration lock held (a `kumiko
// migrate` running elsewhere) logs, like the CLI, that it waits and for
// which backend, with the request's id, and applies once the lock is free.
// It waited in silence: the request just hung.
func TestMaintenanceMigrateSaysItWaitsForTheLock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupOps(t)
	set := kumikotest.Migrations(t)
	set["00099_after_lock.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE after_lock (id int);\n-- +goose Down\nDROP TABLE after_lock;\n")}

	holder, err := pgx.Connect(ctx, b.db.URL)
	require.NoError(t, err)
	defer func() { _ = holder.Close(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID)
	require.NoError(t, err)

	logs := &proctest.Buffer{}
	s := web.New(b.rt, b.keys, &web.Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	admin.MountMaintenance(s.Echo(), s.Authenticate, b.db.Pool, b.reg, set)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	other := *b.bundle
	other.url, other.client = srv.URL, srv.Client()

	tok := b.token(t, "admin")
	done := make(chan envelope, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/admin/migrations/up", nil)
		if err != nil {
			done <- envelope{status: -1}
			return
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("X-Request-ID", "migrate-waits-1")
		res, err := srv.Client().Do(req)
		if err != nil {
			done <- envelope{status: -1}
			return
		}
		res.Body.Close()
		done <- envelope{status: res.StatusCode}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), "waiting for the migration lock held by another session") {
		require.True(t, time.Now().Before(deadline), "no word that it waits: %q", logs.String())
		time.Sleep(20 * time.Millisecond)
	}
	require.Contains(t, logs.String(), fmt.Sprintf(`"holder_pid":%d`, holder.PgConn().PID()))
	require.Contains(t, logs.String(), `"request_id":"migrate-waits-1"`)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, (<-done).status)
	m := decode[migrationsJSON](t, other.do(t, http.MethodGet, "/api/admin/migrations", tok, ""))
	require.Zero(t, m.Pending)
}
