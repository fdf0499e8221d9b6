package migrate_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// A migration run that finds the lock held (another kumiko migrate, a
// process migrating a large table) says that it waits, and for whom, and
// goes on as soon as the lock is free. goose's locker polled every 5 s,
// silently, and gave up after 5 minutes with "failed to acquire lock", so
// a second migrator failed while the first ran a long migration. It waits
// as long as its context lets it.
func TestApplyWaitsForTheLockAndSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	set := kumikotest.Migrations(t)
	db := kumikotest.NewDBFrom(t, set)
	pending := fstest.MapFS{}
	for k, v := range set {
		pending[k] = v
	}
	pending["00099_after_lock.sql"] = &fstest.MapFile{Data: []byte("-- +goose Up\nCREATE TABLE after_lock (id int);\n-- +goose Down\nDROP TABLE after_lock;\n")}

	holder, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	defer func() { _ = holder.Close(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID)
	require.NoError(t, err)
	holderPID := holder.PgConn().PID()

	// Stopped while it waits: the context's error, at once.
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = migrate.Apply(short, db.Pool, pending, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 3*time.Second)

	var logs proctest.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	type result struct {
		applied []migrate.Status
		err     error
	}
	done := make(chan result, 1)
	go func() {
		applied, err := migrate.Apply(ctx, db.Pool, pending, log)
		done <- result{applied, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "waiting for the migration lock") {
		require.True(t, time.Now().Before(deadline), "no word that it waits: %q", logs.String())
		time.Sleep(20 * time.Millisecond)
	}
	require.Contains(t, logs.String(), `"holder_pid":`+strconv.FormatUint(uint64(holderPID), 10))
	select {
	case r := <-done:
		t.Fatalf("applied under a lock held elsewhere: %v %v", r.applied, r.err)
	case <-time.After(time.Second):
	}
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID)
	require.NoError(t, err)
	released := time.Now()
	r := <-done
	require.NoError(t, r.err)
	require.Less(t, time.Since(released), 2*time.Second, "it went on long after the lock was free")
	require.Len(t, r.applied, 1)
	require.Equal(t, "00099_after_lock.sql", r.applied[0].Name)
}
