package eventstore

import (
	"context"
	"fmt"
)

// CommitKeyAheadError reports an event log whose commit keys are not below
// the server's transaction ids, as after a pg_dump/pg_restore into a new
// cluster (whose transaction ids start low again). Readers then deliver
// nothing (no restored event is below the visibility horizon), and events
// appended meanwhile get keys below the restored ones and below the
// consumers' cursors, so they are never delivered. The repair, before any
// writer starts: stop the server, run pg_resetwal -e [CommitKeyAheadError.Epoch]
// on its data directory, start it.
type CommitKeyAheadError struct {
	// MaxCommitKey is the largest commit key in the log or in a consumer
	// cursor.
	MaxCommitKey uint64
	// NextXID is the server's next transaction id (an xid8, epoch included).
	NextXID uint64
}

// Epoch returns the transaction-id epoch to give the server with
// pg_resetwal -e: the smallest one whose transaction ids are all above
// MaxCommitKey.
func (e *CommitKeyAheadError) Epoch() uint64 { return e.MaxCommitKey>>32 + 1 }

// Error explains the mismatch and the way out (pg_resetwal -e).
func (e *CommitKeyAheadError) Error() string {
	return fmt.Sprintf("eventstore: the event log's largest commit key %d is not below the server's next "+
		"transaction id %d: transaction ids restarted (a pg_dump and restore into a new cluster?), so no event "+
		"is delivered and new events sort before the restored ones; before any process writes, stop the "+
		"server, run pg_resetwal -e %d <data directory>, and start it again",
		e.MaxCommitKey, e.NextXID, e.Epoch())
}

// checkCommitKeys reads the largest commit key backwards along
// events_order_idx (one index entry; xid8 has no max() before
// PostgreSQL 16), the largest consumer cursor's key (a small table; a
// cursor stays at its key when the events behind it are pruned) and the
// next transaction id, without taking one (pg_current_xact_id() would
// assign an xid). Either key is NULL when its table is empty.
const checkCommitKeys = `SELECT
  (SELECT commit_key FROM events ORDER BY commit_key DESC, position DESC LIMIT 1),
  (SELECT cursor_commit_key FROM event_consumers ORDER BY cursor_commit_key DESC LIMIT 1),
  pg_snapshot_xmax(pg_current_snapshot())`

// CheckCommitKeys returns a [*CommitKeyAheadError] when the log's largest
// commit key, or a consumer cursor's, is not below the server's next
// transaction id, which never happens on the cluster that wrote the log
// (every key is some transaction's id or an earlier key); nil for a
// healthy or empty log, or the query's error. Cursors count because their
// events may have been pruned: an event appended behind a cursor is never
// delivered. It is one index probe, cheap enough for a readiness
// check. db must see every tenant's events (the pool's owner role, not
// kumiko_tenant).
func CheckCommitKeys(ctx context.Context, db DB) error {
	var event, cursor *uint64
	var next uint64
	if err := db.QueryRow(ctx, checkCommitKeys).Scan(&event, &cursor, &next); err != nil {
		return fmt.Errorf("eventstore: check commit keys: %w", err)
	}
	var maxKey uint64
	if event != nil {
		maxKey = *event
	}
	if cursor != nil {
		maxKey = max(maxKey, *cursor)
	}
	if maxKey >= next {
		return &CommitKeyAheadError{MaxCommitKey: maxKey, NextXID: next}
	}
	return nil
}
