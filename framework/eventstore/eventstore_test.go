package eventstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

func ev(typ string, n int) eventstore.NewEvent {
	return eventstore.NewEvent{Type: typ, TypeVersion: 1, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n))}
}

func stream(id string) eventstore.StreamRef {
	return eventstore.StreamRef{TenantID: "t1", Type: "thing", ID: id}
}

// appendTx appends in its own committed transaction.
func appendTx(t *testing.T, pool *pgxpool.Pool, s eventstore.StreamRef, expected int64, events ...eventstore.NewEvent) []eventstore.Appended {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	out, err := eventstore.Append(ctx, tx, s, expected, events)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	return out
}

// readN reads from cursor until n events arrived. Other tests' open
// transactions hold the cluster-wide horizon back for a moment, so it polls.
func readN(t *testing.T, pool *pgxpool.Pool, cur eventstore.Cursor, n int) ([]eventstore.Record, eventstore.Cursor) {
	t.Helper()
	var all []eventstore.Record
	deadline := time.Now().Add(20 * time.Second)
	for len(all) < n {
		recs, c := readAll(t, pool, cur)
		all, cur = append(all, recs...), c
		if time.Now().After(deadline) {
			t.Fatalf("read %d of %d events", len(all), n)
		}
		if len(all) < n {
			time.Sleep(5 * time.Millisecond)
		}
	}
	require.Len(t, all, n)
	return all, cur
}

// readAll drains the reader from cursor.
func readAll(t *testing.T, pool *pgxpool.Pool, cur eventstore.Cursor) ([]eventstore.Record, eventstore.Cursor) {
	t.Helper()
	var all []eventstore.Record
	for {
		recs, err := eventstore.ReadAfter(context.Background(), pool, cur, 1000)
		require.NoError(t, err)
		if len(recs) == 0 {
			return all, cur
		}
		all = append(all, recs...)
		cur = recs[len(recs)-1].Cursor()
	}
}

func TestAppendAndRead(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	got := appendTx(t, db.Pool, stream("a"), eventstore.NoStream, ev("x:event:one", 1), ev("x:event:one", 2), ev("x:event:one", 3))
	require.Len(t, got, 3)
	for i, a := range got {
		require.EqualValues(t, i+1, a.Version)
		if i > 0 {
			require.Greater(t, a.Position, got[i-1].Position, "positions follow versions within one append")
			require.Equal(t, got[0].CommitKey, a.CommitKey)
		}
	}
	more := appendTx(t, db.Pool, stream("a"), eventstore.AnyVersion, ev("x:event:one", 4))
	require.EqualValues(t, 4, more[0].Version)
	recs, _ := readN(t, db.Pool, eventstore.Cursor{}, 4)
	for i, r := range recs {
		require.EqualValues(t, i+1, r.Version)
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i+1), string(r.Payload))
	}
	// The cursor round-trips through its string form.
	c, err := eventstore.ParseCursor(recs[3].Cursor().String())
	require.NoError(t, err)
	require.Equal(t, recs[3].Cursor(), c)
	_, err = eventstore.ParseCursor("nope")
	require.ErrorIs(t, err, eventstore.ErrBadCursor)
}

func TestExpectedVersion(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	appendTx(t, db.Pool, stream("a"), eventstore.NoStream, ev("x:event:one", 1))

	for _, tc := range []struct {
		name     string
		s        eventstore.StreamRef
		expected int64
		actual   int64
	}{
		{"stale version", stream("a"), 5, 1},
		{"new stream that exists", stream("a"), eventstore.NoStream, -1}, // the aborted transaction cannot read it
		{"version of a missing stream", stream("missing"), 3, 0},
	} {
		// One event and several take different statements.
		for _, events := range [][]eventstore.NewEvent{{ev("x:event:one", 9)}, {ev("x:event:one", 9), ev("x:event:one", 10)}} {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, err = eventstore.Append(ctx, tx, tc.s, tc.expected, events)
			var ce *eventstore.ConcurrencyError
			require.ErrorAs(t, err, &ce, tc.name)
			require.Equal(t, tc.expected, ce.Expected, tc.name)
			require.Equal(t, tc.actual, ce.Actual, tc.name)
			require.NoError(t, tx.Rollback(ctx))
		}
	}
	got := appendTx(t, db.Pool, stream("a"), 1, ev("x:event:one", 2))
	require.EqualValues(t, 2, got[0].Version)
	got = appendTx(t, db.Pool, stream("a"), 2, ev("x:event:one", 3), ev("x:event:one", 4))
	require.EqualValues(t, []int64{3, 4}, []int64{got[0].Version, got[1].Version})
	got = appendTx(t, db.Pool, stream("b"), eventstore.NoStream, eventstore.NewEvent{Type: "x:event:one"})
	require.EqualValues(t, 1, got[0].Version)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n))
	require.Equal(t, 5, n)
	var payload string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT payload::text FROM events WHERE stream_id = 'b'`).Scan(&payload))
	require.Equal(t, "{}", payload, "an empty payload is stored as {}")
}

// Malformed events are refused before anything is sent, by the one-event and
// the several-event statement alike; the largest storable type version is
// stored as given.
func TestAppendRefusesMalformedEvents(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		bad  eventstore.NewEvent
		want string
	}{
		{eventstore.NewEvent{Payload: json.RawMessage(`{}`)}, "event without type"},
		{eventstore.NewEvent{Type: "x:event:far", TypeVersion: math.MaxInt32 + 1}, "x:event:far: type version 2147483648 does not fit the log"},
	} {
		for _, events := range [][]eventstore.NewEvent{{tc.bad}, {ev("x:event:one", 1), tc.bad}} {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			_, appendErr := eventstore.Append(ctx, tx, stream("a"), eventstore.AnyVersion, events)
			require.NoError(t, tx.Commit(ctx), "the transaction is untouched")
			require.ErrorContains(t, appendErr, tc.want)
		}
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n))
	require.Zero(t, n)

	appendTx(t, db.Pool, stream("a"), eventstore.NoStream, eventstore.NewEvent{Type: "x:event:far", TypeVersion: math.MaxInt32})
	var v int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT type_version FROM events`).Scan(&v))
	require.EqualValues(t, math.MaxInt32, v)
}

// A conflict inside a pipelined batch must abort the transaction so that a
// COMMIT queued behind it cannot commit the business write without events.
func TestQueuedConflictAbortsPipelinedCommit(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	appendTx(t, db.Pool, stream("a"), eventstore.NoStream, ev("x:event:one", 1))
	_, err := db.Pool.Exec(ctx, `CREATE TABLE side (n int)`)
	require.NoError(t, err)

	// A stale expected version, and a new stream that exists; one event
	// and several take different statements.
	for _, tc := range []struct {
		expected, actual int64
		events           []eventstore.NewEvent
	}{
		{7, 1, []eventstore.NewEvent{ev("x:event:one", 2)}},
		{7, 1, []eventstore.NewEvent{ev("x:event:one", 2), ev("x:event:one", 3)}},
		{eventstore.NoStream, -1, []eventstore.NewEvent{ev("x:event:one", 2)}},
		{eventstore.NoStream, -1, []eventstore.NewEvent{ev("x:event:one", 2), ev("x:event:one", 3)}},
	} {
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`INSERT INTO side VALUES (1)`)
		var appendErr error
		require.NoError(t, eventstore.QueueAppend(b, stream("a"), tc.expected, tc.events, func(_ []eventstore.Appended, err error) error {
			appendErr = err
			return err
		}))
		b.Queue(`COMMIT`)
		err = conn.SendBatch(ctx, b).Close()
		require.Error(t, err)
		var ce *eventstore.ConcurrencyError
		require.ErrorAs(t, appendErr, &ce, "expected %d", tc.expected)
		require.Equal(t, tc.actual, ce.Actual)
		_, err = conn.Exec(ctx, `ROLLBACK`)
		require.NoError(t, err)
		conn.Release()
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM side`).Scan(&n))
		require.Zero(t, n, "the business write must not commit (expected %d)", tc.expected)
	}
}

// Transaction A takes its xid early (a business write) and appends late;
// B appends and commits in between. A reader that has read after B's commit
// must still deliver A's event, before B's.
func TestGaplessEarlyXidLateCommit(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE side (n int)`)
	require.NoError(t, err)

	txA, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = txA.Exec(ctx, `INSERT INTO side VALUES (1)`) // takes A's xid now
	require.NoError(t, err)

	appendTx(t, db.Pool, stream("b"), eventstore.NoStream, ev("x:event:b", 1))

	seen, cur := readAll(t, db.Pool, eventstore.Cursor{})
	require.Empty(t, seen, "B's event waits behind A's open xid")

	_, err = eventstore.Append(ctx, txA, stream("a"), eventstore.NoStream, []eventstore.NewEvent{ev("x:event:a", 1)})
	require.NoError(t, err)
	require.NoError(t, txA.Commit(ctx))

	rest, _ := readN(t, db.Pool, cur, 2)
	require.Equal(t, "x:event:a", rest[0].Type, "A's lower commit key sorts first")
	require.Equal(t, "x:event:b", rest[1].Type)
}

// The classic loss of an id > cursor reader: A draws the lower position but
// commits after B. The horizon reader loses nothing; the naive reader does.
func TestGaplessLowerPositionCommitsLater(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()

	txA, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	a, err := eventstore.Append(ctx, txA, stream("a"), eventstore.NoStream, []eventstore.NewEvent{ev("x:event:a", 1)})
	require.NoError(t, err)
	b := appendTx(t, db.Pool, stream("b"), eventstore.NoStream, ev("x:event:b", 1))
	require.Greater(t, b[0].Position, a[0].Position)

	// Naive reader: position > cursor, no horizon.
	var naiveCursor int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(max(position), 0) FROM events`).Scan(&naiveCursor))
	require.Equal(t, b[0].Position, naiveCursor, "the naive reader has moved past A's position")

	seen, cur := readAll(t, db.Pool, eventstore.Cursor{})
	require.Empty(t, seen)
	require.NoError(t, txA.Commit(ctx))

	var naiveLater int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE position > $1`, naiveCursor).Scan(&naiveLater))
	require.Zero(t, naiveLater, "the naive reader never sees A's event")

	rest, _ := readN(t, db.Pool, cur, 2) // the horizon reader delivers both
	require.Len(t, rest, 2)
}

// The early-xid transaction appends version 6 after another transaction
// committed version 5: GREATEST() with the stream's previous key keeps 6
// after 5 although A's xid is older.
func TestPerStreamOrderWithEarlyXid(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE side (n int)`)
	require.NoError(t, err)
	for i := 1; i <= 4; i++ {
		appendTx(t, db.Pool, stream("s"), eventstore.AnyVersion, ev("x:event:n", i))
	}
	_, cur := readN(t, db.Pool, eventstore.Cursor{}, 4)

	txA, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	var xidA uint64
	require.NoError(t, txA.QueryRow(ctx, `INSERT INTO side VALUES (1) RETURNING pg_current_xact_id()`).Scan(&xidA))

	v5 := appendTx(t, db.Pool, stream("s"), 4, ev("x:event:n", 5))
	require.Greater(t, v5[0].CommitKey, xidA)

	v6, err := eventstore.Append(ctx, txA, stream("s"), 5, []eventstore.NewEvent{ev("x:event:n", 6)})
	require.NoError(t, err)
	require.EqualValues(t, 6, v6[0].Version)
	require.Equal(t, v5[0].CommitKey, v6[0].CommitKey, "version 6 inherits version 5's key, not A's older xid")
	require.NoError(t, txA.Commit(ctx))

	rest, _ := readN(t, db.Pool, cur, 2)
	require.EqualValues(t, 5, rest[0].Version)
	require.EqualValues(t, 6, rest[1].Version)
}

// A writer waiting for the stream lock draws its position after the lock,
// so positions follow versions within a stream.
func TestPositionDrawnAfterStreamLock(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	appendTx(t, db.Pool, stream("s"), eventstore.NoStream, ev("x:event:n", 1))

	txA, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	a, err := eventstore.Append(ctx, txA, stream("s"), eventstore.AnyVersion, []eventstore.NewEvent{ev("x:event:n", 2)})
	require.NoError(t, err)

	done := make(chan []eventstore.Appended, 1)
	go func() {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			done <- nil
			return
		}
		out, err := eventstore.Append(ctx, tx, stream("s"), eventstore.AnyVersion, []eventstore.NewEvent{ev("x:event:n", 3)})
		if err != nil {
			_ = tx.Rollback(ctx)
			done <- nil
			return
		}
		_ = tx.Commit(ctx)
		done <- out
	}()
	// B blocks on the row lock, while a third writer draws a position.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		if n > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "B never waits for the stream lock")
		time.Sleep(5 * time.Millisecond)
	}
	other := appendTx(t, db.Pool, stream("other"), eventstore.NoStream, ev("x:event:n", 0))
	require.NoError(t, txA.Commit(ctx))
	b := <-done
	require.NotNil(t, b)
	require.EqualValues(t, 3, b[0].Version)
	require.Greater(t, b[0].Position, a[0].Position)
	// Any position B drew is above A's; only one drawn after the lock is
	// above the one the third writer drew while B waited.
	require.Greater(t, b[0].Position, other[0].Position, "B drew its position before the stream lock")
	require.GreaterOrEqual(t, b[0].CommitKey, a[0].CommitKey)
}

func TestSavepointRollbackIsNotRead(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = eventstore.Append(ctx, tx, stream("kept"), eventstore.NoStream, []eventstore.NewEvent{ev("x:event:n", 1)})
	require.NoError(t, err)
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = eventstore.Append(ctx, sp, stream("dropped"), eventstore.NoStream, []eventstore.NewEvent{ev("x:event:n", 2)})
	require.NoError(t, err)
	require.NoError(t, sp.Rollback(ctx))
	require.NoError(t, tx.Commit(ctx))
	recs, _ := readN(t, db.Pool, eventstore.Cursor{}, 1)
	require.Equal(t, "kept", recs[0].StreamID)
}

func TestSchemaDetails(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	var cache int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT cache_size FROM pg_sequences WHERE sequencename = 'kumiko_event_position_seq'`).Scan(&cache))
	require.EqualValues(t, 1, cache, "a cached position block inverts stream versions")

	// The tenant role can neither rewrite the log nor delete stream heads.
	appendTx(t, db.Pool, stream("a"), eventstore.NoStream, ev("x:event:n", 1))
	for _, stmt := range []string{
		`UPDATE events SET payload = '{}'`,
		`DELETE FROM events`,
		`DELETE FROM streams`,
	} {
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT set_config('kumiko.tenant_id', 't1', true)`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL ROLE kumiko_tenant`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, stmt)
		require.Error(t, err, stmt)
		require.NoError(t, tx.Rollback(ctx))
	}
}

func TestReadStreamAsOf(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		appendTx(t, db.Pool, stream("s"), eventstore.AnyVersion, ev("x:event:n", i))
	}
	all, err := eventstore.ReadStream(ctx, db.Pool, stream("s"), eventstore.AsOf{})
	require.NoError(t, err)
	require.Len(t, all, 3)
	upTo2, err := eventstore.ReadStream(ctx, db.Pool, stream("s"), eventstore.AsOf{Version: 2})
	require.NoError(t, err)
	require.Len(t, upTo2, 2)
	atFirst, err := eventstore.ReadStream(ctx, db.Pool, stream("s"), eventstore.AsOf{Time: all[0].CreatedAt})
	require.NoError(t, err)
	require.Len(t, atFirst, 1)
}

// The stress test of ARCHITECTURE §2: concurrent writers with random delays
// inside their transactions (some take their xid early and commit late),
// savepoints and rollbacks, and a reader loop running throughout. Every
// committed event is read exactly once, no rolled-back one ever, and
// versions per stream strictly increase in read order.
func TestStressGaplessConcurrentWriters(t *testing.T) {
	t.Parallel()
	const (
		writers = 32
		total   = 20000
		streams = 200
	)
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE side (n int)`)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = writers + 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	var committed sync.Map // position → "stream:version"
	var nCommitted, nRolledBack atomic.Int64
	var remaining atomic.Int64
	remaining.Store(total)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for remaining.Add(-1) >= 0 {
				if err := stressTx(ctx, pool, rng, streams, &committed, &nCommitted, &nRolledBack); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}

	// Reader loop, concurrent with the writers.
	type seenEvent struct {
		stream  string
		version int64
	}
	seen := map[int64]seenEvent{}
	lastVersion := map[string]int64{}
	var cur eventstore.Cursor
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()
	readBatch := func() int {
		recs, err := eventstore.ReadAfter(ctx, pool, cur, 500)
		require.NoError(t, err)
		for _, r := range recs {
			require.True(t, cur.Less(r.Cursor()), "reader went backwards")
			cur = r.Cursor()
			_, dup := seen[r.Position]
			require.False(t, dup, "event %d delivered twice", r.Position)
			seen[r.Position] = seenEvent{r.StreamID, r.Version}
			require.Greater(t, r.Version, lastVersion[r.StreamID], "stream %s out of order", r.StreamID)
			lastVersion[r.StreamID] = r.Version
		}
		return len(recs)
	}
loop:
	for {
		select {
		case <-writersDone:
			break loop
		default:
			if readBatch() == 0 {
				time.Sleep(time.Millisecond)
			}
		}
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for int64(len(seen)) < nCommitted.Load() && time.Now().Before(deadline) {
		if readBatch() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(50 * time.Millisecond)
	for readBatch() > 0 {
	}
	require.EqualValues(t, nCommitted.Load(), len(seen), "every committed event read exactly once")
	committed.Range(func(k, v any) bool {
		_, ok := seen[k.(int64)]
		require.True(t, ok, "committed event %d never read", k)
		return true
	})
	require.Positive(t, nRolledBack.Load())
	t.Logf("committed %d, rolled back %d", nCommitted.Load(), nRolledBack.Load())
}

func stressTx(ctx context.Context, pool *pgxpool.Pool, rng *rand.Rand, streams int, committed *sync.Map, nCommitted, nRolledBack *atomic.Int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if rng.IntN(4) == 0 { // take the xid early
		if _, err := tx.Exec(ctx, `INSERT INTO side VALUES (1)`); err != nil {
			return err
		}
	}
	if d := rng.IntN(3); d > 0 {
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
	}
	s := stream(fmt.Sprintf("s%d", rng.IntN(streams)))
	n := 1 + rng.IntN(2)
	events := make([]eventstore.NewEvent, n)
	for i := range events {
		events[i] = ev("x:event:stress", i)
	}
	var target pgx.Tx = tx
	useSavepoint := rng.IntN(10) == 0
	if useSavepoint {
		if target, err = tx.Begin(ctx); err != nil {
			return err
		}
	}
	out, err := eventstore.Append(ctx, target, s, eventstore.AnyVersion, events)
	if err != nil {
		return err
	}
	if useSavepoint && rng.IntN(2) == 0 {
		if err := target.Rollback(ctx); err != nil {
			return err
		}
		nRolledBack.Add(int64(n))
		out = nil
	}
	if rng.IntN(3) == 0 {
		time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // commit late
	}
	if rng.IntN(12) == 0 {
		nRolledBack.Add(int64(len(out)))
		return tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return nil
		}
		return err
	}
	for _, a := range out {
		committed.Store(a.Position, s.ID)
	}
	nCommitted.Add(int64(len(out)))
	return nil
}
