package migrate_test

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/migrations"
)

// A migration cut short because the caller's context ended (the client of
// POST /api/admin/migrations/up hung up, Ctrl-C on `kumiko migrate`) did
// not fail: it was stopped. Apply used to report it as a *FailedError,
// which the admin API answers as 409 "migration_failed" and an operator
// reads as a migration to fix. It is the context's error now, with what was
// applied before; the stopped migration left nothing and stays pending.
func TestApplyCutShortByItsContext(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
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
	set["00099_slow.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE slow_half (id int);\nSELECT pg_sleep(30);\n-- +goose Down\nDROP TABLE slow_half;\n")}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Cancel once the slow migration runs.
		for ctx.Err() == nil {
			var n int
			err := db.Pool.QueryRow(context.Background(),
				`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%pg_sleep(30)%' AND pid <> pg_backend_pid()`).Scan(&n)
			if err == nil && n > 0 {
				cancel()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	start := time.Now()
	applied, err := migrate.Apply(ctx, db.Pool, set, nil)
	require.Less(t, time.Since(start), 20*time.Second, "the cancel stops the migration")
	require.Error(t, err)
	require.ErrorIs(t, err, context.Canceled)
	_, failed := errors.AsType[*migrate.FailedError](err)
	require.False(t, failed, "a cancelled migration is reported as failed: %v", err)
	require.Contains(t, err.Error(), "00099_slow.sql")
	require.Len(t, applied, 1)
	require.Equal(t, "00098_first.sql", applied[0].Name)

	sts, err := migrate.List(context.Background(), db.Pool, set)
	require.NoError(t, err)
	require.Equal(t, "00099_slow.sql", sts[len(sts)-1].Name)
	require.False(t, sts[len(sts)-1].Applied, "the stopped migration stays pending")
	require.True(t, sts[len(sts)-2].Applied)
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_tables WHERE tablename = 'slow_half'`).Scan(&n))
	require.Zero(t, n, "the stopped migration left nothing behind")
}
