package migrate_test

import (
	"context"
	"strings"
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

// kumiko_stream_partition runs in the filter of every pass of a partitioned
// consumer, on each event it reads past (those of the other partitions
// too), and in the lag, readiness and retention queries. The planner must
// inline it: called as a SQL function it costs some twenty times as much
// per row. It maps every stream as before.
func TestStreamPartitionIsInlined(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	rows, err := db.Pool.Query(ctx, `EXPLAIN (VERBOSE, COSTS OFF) SELECT kumiko_stream_partition(stream_id, 4) FROM events`)
	require.NoError(t, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.NotContains(t, strings.Join(plan, "\n"), "kumiko_stream_partition(", "the function is called, not inlined")

	var mismatched int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM generate_series(1, 2000) g, generate_series(0, 64) n
		WHERE kumiko_stream_partition(g::text, n) IS DISTINCT FROM
		  CASE WHEN n <= 1 THEN 0 ELSE (((hashtextextended(g::text, 0) % n) + n) % n)::int END`).Scan(&mismatched))
	require.Zero(t, mismatched, "a stream changed partitions")
}
