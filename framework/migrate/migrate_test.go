package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/migrations"
)

// Reading the migrations' state does not wait for the lock a running
// migration holds: readiness probes (migrate.Check) answer at once while
// `kumiko migrate` runs elsewhere, and overlapping probes never fail each
// other.
func TestCheckDoesNotWaitForARunningMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	// What `migrate up` holds for its whole run.
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID) }()

	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, migrate.Check(cctx, db.Pool, nil), "every migration is applied")
	sts, err := migrate.List(cctx, db.Pool, nil)
	require.NoError(t, err)
	require.NotEmpty(t, sts)
	require.Less(t, time.Since(start), time.Second)

	done := make(chan error, 4)
	for range 4 {
		go func() { done <- migrate.Check(cctx, db.Pool, nil) }()
	}
	for range 4 {
		require.NoError(t, <-done, "overlapping checks")
	}
}

// Apply answers the migrations it applied, and none when nothing is
// pending; Up counts them.
func TestApplyAnswersWhatItApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	sts, err := migrate.List(ctx, db.Pool, nil)
	require.NoError(t, err)
	newest := sts[len(sts)-1]

	sqlDB := stdlib.OpenDBFromPool(db.Pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS)
	require.NoError(t, err)
	_, err = p.Down(ctx)
	require.NoError(t, err)

	applied, err := migrate.Apply(ctx, db.Pool, nil, nil)
	require.NoError(t, err)
	require.Equal(t, []migrate.Status{newest}, applied)
	applied, err = migrate.Apply(ctx, db.Pool, nil, nil)
	require.NoError(t, err)
	require.Empty(t, applied)
	n, err := migrate.Up(ctx, db.Pool, nil, nil)
	require.NoError(t, err)
	require.Zero(t, n)
}
