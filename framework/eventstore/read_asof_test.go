package eventstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// versions returns the records' versions.
func versions(recs []eventstore.Record) []int64 {
	out := []int64{}
	for _, r := range recs {
		out = append(out, r.Version)
	}
	return out
}

// A transaction that started early appends v2 after another one committed
// v1, so v2's creation time (its transaction's start) is older than v1's.
// A read as of a time never leaves a gap: as of v2's time the stream is
// empty (v1 was created after it), as of v1's time it holds both.
func TestReadAsOfTimeLeavesNoGap(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	s := stream("early")
	early, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = early.Rollback(ctx) }()
	_, err = early.Exec(ctx, `SELECT now()`)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	appendTx(t, db.Pool, s, eventstore.NoStream, ev("a", 1))
	_, err = eventstore.Append(ctx, early, s, eventstore.AnyVersion, []eventstore.NewEvent{ev("b", 2)})
	require.NoError(t, err)
	require.NoError(t, early.Commit(ctx))
	all, err := eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, versions(all))
	require.True(t, all[1].CreatedAt.Before(all[0].CreatedAt), "v2 was created (its transaction began) before v1")

	got, err := eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{Time: all[1].CreatedAt})
	require.NoError(t, err)
	require.Empty(t, versions(got), "v2 without v1")
	got, err = eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{Time: all[0].CreatedAt})
	require.NoError(t, err)
	require.Equal(t, []int64{1, 2}, versions(got))
}

// A stream whose early events were deleted (a prune of its types) is an
// error for every read that would fold it, not a state built from the rest.
func TestTruncatedStreamIsAnError(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	for name, deleteSQL := range map[string]string{
		"early events": `DELETE FROM events WHERE stream_id = 'pruned-early' AND version < 3`,
		"every event":  `DELETE FROM events WHERE stream_id = 'pruned-all'`,
	} {
		s := stream("pruned-early")
		if name == "every event" {
			s = stream("pruned-all")
		}
		appendTx(t, db.Pool, s, eventstore.NoStream, ev("a", 1), ev("b", 2), ev("c", 3))
		_, err := db.Pool.Exec(ctx, deleteSQL)
		require.NoError(t, err)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, _, err = eventstore.FetchForWriting(ctx, tx, s)
		require.ErrorIs(t, err, eventstore.ErrTruncated, name)
		_ = tx.Rollback(ctx)
		if name == "early events" {
			_, err = eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{})
			require.ErrorIs(t, err, eventstore.ErrTruncated, name)
		}
	}
}

// A stream whose latest events, or all of them, were deleted (a prune of
// some of its types) is an error for a plain read too: folding the events
// that are left gives an older state, or none, as if it were the current
// one. A read bounded below the deleted events still answers.
func TestReadOfStreamMissingItsLatestEventsIsAnError(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	tail, all := stream("pruned-tail"), stream("pruned-every")
	appendTx(t, db.Pool, tail, eventstore.NoStream, ev("placed", 1), ev("cancelled", 2))
	appendTx(t, db.Pool, all, eventstore.NoStream, ev("placed", 1), ev("cancelled", 2))
	_, err := db.Pool.Exec(ctx, `DELETE FROM events WHERE (stream_id = 'pruned-tail' AND type = 'cancelled') OR stream_id = 'pruned-every'`)
	require.NoError(t, err)

	for _, s := range []eventstore.StreamRef{tail, all} {
		_, err = eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{})
		require.ErrorIs(t, err, eventstore.ErrTruncated, s.ID)
		_, err = eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{Version: 2})
		require.ErrorIs(t, err, eventstore.ErrTruncated, s.ID)
		_, err = eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{Time: time.Now()})
		require.ErrorIs(t, err, eventstore.ErrTruncated, s.ID)
	}
	got, err := eventstore.ReadStream(ctx, db.Pool, tail, eventstore.AsOf{Version: 1})
	require.NoError(t, err)
	require.Equal(t, []int64{1}, versions(got))
	_, err = eventstore.ReadStream(ctx, db.Pool, all, eventstore.AsOf{Version: 1})
	require.ErrorIs(t, err, eventstore.ErrTruncated)

	_, err = eventstore.ReadStream(ctx, db.Pool, tail, eventstore.AsOf{Version: -1})
	require.ErrorContains(t, err, "negative")

	// A stream that does not exist is empty, not truncated.
	got, err = eventstore.ReadStream(ctx, db.Pool, stream("never"), eventstore.AsOf{})
	require.NoError(t, err)
	require.Empty(t, got)
}
