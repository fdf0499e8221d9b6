package eventstore_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/internal/pgcluster"
)

// readmeEpochSQL is the README's query for the epoch to give pg_resetwal
// (section "The event log and its guarantees"); keep the two the same.
const readmeEpochSQL = `SELECT coalesce(max(k) >> 32, -1) + 1 FROM (
    SELECT commit_key::text::bigint FROM events UNION ALL
    SELECT last_commit_key::text::bigint FROM streams UNION ALL
    SELECT cursor_commit_key::text::bigint FROM event_consumers) AS t(k)`

// TestRestoreIntoNewCluster runs the README's procedure for a log dumped
// with pg_dump and restored with pg_restore into a new cluster: there the
// restored commit keys lie above the new cluster's transaction ids, so
// nothing is delivered and a new event sorts before the restored ones;
// CheckCommitKeys says so and names the epoch; after pg_resetwal -e with it
// the check passes and the log reads the restored events, then new ones, in
// order.
func TestRestoreIntoNewCluster(t *testing.T) {
	t.Parallel()
	bin, err := pgcluster.BinDir()
	if err != nil {
		t.Skipf("skipped: the PostgreSQL server binaries are missing: %v", err)
	}
	for _, name := range []string{"initdb", "postgres", "pg_dump", "pg_restore", "pg_resetwal"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			t.Skipf("skipped: the PostgreSQL binary %s is missing from %s", name, bin)
		}
	}
	ctx := t.Context()
	d := pgcluster.New(t)
	open := func(s *pgcluster.Server) *pgxpool.Pool {
		pool, err := pgxpool.New(ctx, s.URL("kumiko"))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	createDB := func(s *pgcluster.Server) {
		conn, err := pgx.Connect(ctx, s.URL("postgres"))
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `CREATE DATABASE kumiko`)
		require.NoError(t, err)
	}

	// Cluster A, an old cluster: its transaction ids are in epoch 3, so
	// its commit keys are above 3<<32.
	dirA := d.InitDB("a")
	d.Run("pg_resetwal", "-e", "3", dirA)
	a := d.Start(dirA)
	createDB(a)
	poolA := open(a)
	_, err = migrate.Up(ctx, poolA, nil, nil)
	require.NoError(t, err)
	appendTx(t, poolA, stream("s1"), eventstore.NoStream, ev("thing:event:made", 1), ev("thing:event:made", 2))
	appendTx(t, poolA, stream("s2"), eventstore.NoStream, ev("thing:event:made", 3))
	restored, cursor := readN(t, poolA, eventstore.Cursor{}, 3)
	require.Greater(t, cursor.CommitKey, uint64(3)<<32)
	require.NoError(t, eventstore.CheckCommitKeys(ctx, poolA))
	dump := filepath.Join(d.Path, "kumiko.dump")
	d.Run("pg_dump", "-h", "127.0.0.1", "-p", strconv.Itoa(a.Port), "-U", "postgres", "-Fc", "-f", dump, "kumiko")
	poolA.Close()
	a.Stop()

	// Cluster B, new: the dump restored (roles are not in a dump; the
	// tenant role is created first, as pg_dumpall --roles-only would).
	dirB := d.InitDB("b")
	b := d.Start(dirB)
	createDB(b)
	poolB := open(b)
	_, err = poolB.Exec(ctx, `CREATE ROLE kumiko_tenant NOLOGIN`)
	require.NoError(t, err)
	d.Run("pg_restore", "-h", "127.0.0.1", "-p", strconv.Itoa(b.Port), "-U", "postgres", "--exit-on-error", "-d", "kumiko", dump)

	err = eventstore.CheckCommitKeys(ctx, poolB)
	var ahead *eventstore.CommitKeyAheadError
	require.True(t, errors.As(err, &ahead), "%v", err)
	require.Equal(t, cursor.CommitKey, ahead.MaxCommitKey)
	require.Equal(t, uint64(4), ahead.Epoch())
	require.Contains(t, err.Error(), "pg_resetwal -e 4 ")
	var readmeEpoch uint64
	require.NoError(t, poolB.QueryRow(ctx, readmeEpochSQL).Scan(&readmeEpoch))
	require.Equal(t, ahead.Epoch(), readmeEpoch, "the README's query computes the same epoch")
	recs, err := eventstore.ReadAfter(ctx, poolB, eventstore.Cursor{}, 100)
	require.NoError(t, err)
	require.Empty(t, recs, "the restored events lie above the new cluster's horizon")
	// An append now lands before the events a consumer has passed (its
	// cursor was restored), where that consumer never reads it. (Rolled
	// back: committed, it would stay there after the repair.)
	tx, err := poolB.Begin(ctx)
	require.NoError(t, err)
	early, err := eventstore.Append(ctx, tx, stream("s3"), eventstore.NoStream, []eventstore.NewEvent{ev("thing:event:made", 0)})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.True(t, eventstore.Cursor{CommitKey: early[0].CommitKey, Position: early[0].Position}.Less(cursor),
		"a new event sorts before the restored ones")

	// The repair: stop B, raise its epoch as the error says, start it.
	poolB.Close()
	b.Stop()
	d.Run("pg_resetwal", "-e", strconv.FormatUint(ahead.Epoch(), 10), dirB)
	b = d.Start(dirB)
	poolB = open(b)
	require.NoError(t, eventstore.CheckCommitKeys(ctx, poolB))
	appendTx(t, poolB, stream("s3"), eventstore.NoStream, ev("thing:event:made", 4))
	appendTx(t, poolB, stream("s1"), 2, ev("thing:event:made", 5))
	all, _ := readN(t, poolB, eventstore.Cursor{}, 5)
	require.Equal(t, restored, all[:3], "the restored events first, as on A")
	for i, r := range all[3:] {
		require.True(t, cursor.Less(r.Cursor()), "new event %d after the restored cursor", i)
		require.JSONEq(t, `{"n":`+strconv.Itoa(4+i)+`}`, string(r.Payload))
	}
	after, _ := readN(t, poolB, cursor, 2)
	require.Equal(t, all[3:], after, "a consumer at the restored cursor reads exactly the new events")
}
