package migrate_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
)

// emptyDB creates a database with nothing in it (never migrated), dropped
// when the test ends, and returns a pool on it.
func emptyDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "kumiko_migrate_empty_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, kumikotest.AdminURL())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		_ = admin.Close(ctx)
	})
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, kumikotest.WithDatabase(kumikotest.AdminURL(), name))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// Reading the migrations' state writes nothing: on a database never
// migrated, List reports every migration pending and Check ErrPending
// (what `kumiko migrate status` and the readiness probe answer), and
// goose's version table is still missing afterwards. goose's status
// created it, so a probe or a status changed the database it looked at.
func TestListAndCheckLeaveANewDatabaseUntouched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDB(t)

	sts, err := migrate.List(ctx, pool, nil)
	require.NoError(t, err)
	require.NotEmpty(t, sts)
	for _, s := range sts {
		require.False(t, s.Applied, s.Name)
	}
	err = migrate.Check(ctx, pool, nil)
	require.ErrorIs(t, err, migrate.ErrPending)
	require.ErrorContains(t, err, sts[0].Name)
	unknown, err := migrate.Unknown(ctx, pool, nil)
	require.NoError(t, err)
	require.Empty(t, unknown)

	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')`).Scan(&tables))
	require.Zero(t, tables, "a read created relations (goose_db_version?)")

	// Once migrated, the same calls see it all applied.
	_, err = migrate.Up(ctx, pool, nil, nil)
	require.NoError(t, err)
	require.NoError(t, migrate.Check(ctx, pool, nil))
}
