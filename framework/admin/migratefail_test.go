package admin_test

import (
	"context"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/admin"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/migrations"
)

// TestMaintenanceMigrationThatFails: POST /api/admin/migrations/up with a
// migration that fails (here on the data it meets) answers, like the CLI,
// which migration failed and why, and which ones it applied before it,
// instead of the opaque 500 of a server crash; the failed migration left
// nothing behind (goose runs each in its own transaction) and stays pending.
func TestMaintenanceMigrationThatFails(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	set := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return err
		}
		data, err := fs.ReadFile(migrations.FS, path)
		set[path] = &fstest.MapFile{Data: data}
		return err
	}))
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
