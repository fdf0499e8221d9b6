package kumikotest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// recordingTB records what closeAndDrop reports instead of failing the test.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	errors []string
}

func (r *recordingTB) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n))
	return n == 1
}

// A connection left acquired (a transaction a failed assertion abandoned)
// must not hang the cleanup: it reports the leak in a passing test, stays
// quiet after a failure, and drops the database either way.
func TestCloseAndDropDoesNotHangOnAHeldConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, alreadyFailed := range []bool{false, true} {
		db, _, err := CreateDB(ctx, nil)
		require.NoError(t, err)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)

		rec := &recordingTB{TB: t, failed: alreadyFailed}
		start := time.Now()
		closeAndDrop(rec, db, 300*time.Millisecond)
		require.Less(t, time.Since(start), 20*time.Second)
		if alreadyFailed {
			require.Empty(t, rec.errors)
		} else {
			require.Len(t, rec.errors, 1)
			require.Contains(t, rec.errors[0], "was not released")
		}
		require.False(t, databaseExists(t, db.Name))
		_ = tx.Rollback(ctx) // its backend is gone; this returns the connection and ends Close
	}

	// Without a held connection nothing is reported.
	db, _, err := CreateDB(ctx, nil)
	require.NoError(t, err)
	rec := &recordingTB{TB: t}
	closeAndDrop(rec, db, 300*time.Millisecond)
	require.Empty(t, rec.errors)
	require.False(t, databaseExists(t, db.Name))
}

// WithDatabase points every form of connection string at the named
// database: a `dbname` or `database` query parameter would otherwise win
// over the URL's path (and tests would write into that database), and a
// keyword/value string has no path at all.
func TestWithDatabaseOverridesEveryForm(t *testing.T) {
	t.Parallel()
	for _, base := range []string{
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"postgres://postgres@127.0.0.1:5432/?dbname=postgres&sslmode=disable",
		"postgresql://u:p%40ss@db.example.com/app?database=postgres",
		"host=127.0.0.1 user=postgres dbname=postgres sslmode=disable",
	} {
		cfg, err := pgx.ParseConfig(WithDatabase(base, "kumiko_t_x"))
		require.NoError(t, err, base)
		require.Equal(t, "kumiko_t_x", cfg.Database, base)
	}
}
