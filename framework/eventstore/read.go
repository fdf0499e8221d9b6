package eventstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

const recordColumns = `position, commit_key, tenant_id, stream_type, stream_id, version, type, type_version, payload, metadata, created_at`

// readAfter takes the horizon in the same statement as the scan: a horizon
// read by an earlier statement would let events slip behind the cursor.
const readAfter = `SELECT ` + recordColumns + ` FROM events
WHERE (commit_key, position) > ($1::xid8, $2::bigint)
  AND commit_key < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY commit_key, position
LIMIT $3`

const readAfterTypes = `SELECT ` + recordColumns + ` FROM events
WHERE (commit_key, position) > ($1::xid8, $2::bigint)
  AND commit_key < pg_snapshot_xmin(pg_current_snapshot())
  AND type = ANY($4::text[])
ORDER BY commit_key, position
LIMIT $3`

// ReadOptions narrows [ReadAfterFiltered].
type ReadOptions struct {
	// Types limits the read to these event types; empty means all.
	Types []string
}

// ReadAfter returns up to limit events strictly after cursor and below the
// visibility horizon, in (commit_key, position) order. An event it has not
// returned yet can never later appear before the last one it returned.
func ReadAfter(ctx context.Context, db DB, cursor Cursor, limit int) ([]Record, error) {
	return ReadAfterFiltered(ctx, db, cursor, limit, ReadOptions{})
}

// ReadAfterFiltered is [ReadAfter] restricted by opts.
func ReadAfterFiltered(ctx context.Context, db DB, cursor Cursor, limit int, opts ReadOptions) ([]Record, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("eventstore: read limit %d must be positive", limit)
	}
	var rows pgx.Rows
	var err error
	if len(opts.Types) == 0 {
		rows, err = db.Query(ctx, readAfter, cursor.CommitKey, cursor.Position, limit)
	} else {
		rows, err = db.Query(ctx, readAfterTypes, cursor.CommitKey, cursor.Position, limit, opts.Types)
	}
	if err != nil {
		return nil, fmt.Errorf("eventstore: read after %s: %w", cursor, err)
	}
	recs, err := collect(rows)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read after %s: %w", cursor, err)
	}
	return recs, nil
}

// collect scans event rows.
func collect(rows pgx.Rows) ([]Record, error) {
	defer rows.Close()
	var out []Record
	for rows.Next() {
		var r Record
		// The payload as *[]byte: pgx copies it, where a *json.RawMessage
		// would go through json.Unmarshal.
		if err := rows.Scan(&r.Position, &r.CommitKey, &r.TenantID, &r.StreamType, &r.StreamID, &r.Version,
			&r.Type, &r.TypeVersion, (*[]byte)(&r.Payload), &r.Metadata, &r.CreatedAt); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Horizon returns the current visibility horizon: events with a commit key
// below it are all visible and final.
func Horizon(ctx context.Context, db DB) (uint64, error) {
	var h uint64
	if err := db.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())`).Scan(&h); err != nil {
		return 0, fmt.Errorf("eventstore: horizon: %w", err)
	}
	return h, nil
}

// AsOf bounds a stream read: zero values mean "now".
type AsOf struct {
	// Version, when > 0, reads the stream up to and including this version.
	// A negative version is an error.
	Version int64
	// Time, when non-zero, reads the stream as it was at that time: its
	// events up to the first one created after it. (An event's creation
	// time is its transaction's start, so a transaction that started
	// earlier may append a later version: such a version and the ones
	// after it count as after the time, never leaving a gap.)
	Time time.Time
}

// ErrTruncated is returned (wrapped) when a stream's events do not run
// 1, 2, 3, ... up to its version: some were deleted (a prune of its event
// types with `kumiko events prune --types`). Folding what is left would
// give a wrong state.
var ErrTruncated = errors.New("eventstore: the stream misses events (pruned?); its state cannot be rebuilt")

// readStream drives the read from the stream's head row, so that the
// version the read must end at (last) comes from the same snapshot as the
// events: the head, or the asOf version, or the version before the first
// event created after the asOf time, whichever is lowest. A stream that
// exists yields at least one row (position 0 when none of its events is
// left); one that does not exist yields none. The CASE keeps a read
// without a time from running the time's subquery (LEAST evaluates all its
// arguments, also in the generic plan of the prepared statement).
const readStream = `WITH h AS (
  SELECT LEAST(s.version, CASE WHEN $4::bigint > 0 THEN $4 END,
    CASE WHEN $5::timestamptz IS NOT NULL THEN (SELECT min(version) - 1 FROM events
      WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 AND created_at > $5) END) AS last
  FROM streams s WHERE s.tenant_id = $1 AND s.stream_type = $2 AND s.stream_id = $3
)
SELECT h.last, coalesce(e.position, 0), coalesce(e.commit_key, '0'), coalesce(e.tenant_id, ''),
  coalesce(e.stream_type, ''), coalesce(e.stream_id, ''), coalesce(e.version, 0), coalesce(e.type, ''),
  coalesce(e.type_version, 0), e.payload, coalesce(e.metadata, '{}'), coalesce(e.created_at, 'epoch')
FROM h LEFT JOIN LATERAL (SELECT ` + recordColumns + ` FROM events
  WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 AND version <= h.last
  ORDER BY version) e ON true
ORDER BY e.version`

// ReadStream returns a stream's events in version order, bounded by asOf.
// It reads what the caller's transaction sees (its own uncommitted appends
// included). A stream that misses any event the read should return
// (pruned; also its latest ones, or all of them) is [ErrTruncated]; a
// read bounded by asOf below the missing events answers. A stream that
// does not exist has no events.
func ReadStream(ctx context.Context, db DB, stream StreamRef, asOf AsOf) ([]Record, error) {
	if asOf.Version < 0 {
		return nil, fmt.Errorf("eventstore: read stream %s: as-of version %d is negative", stream, asOf.Version)
	}
	var at *time.Time
	if !asOf.Time.IsZero() {
		at = &asOf.Time
	}
	rows, err := db.Query(ctx, readStream, stream.TenantID, stream.Type, stream.ID, asOf.Version, at)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read stream %s: %w", stream, err)
	}
	recs, last, err := collectStream(rows)
	if err != nil {
		return nil, fmt.Errorf("eventstore: read stream %s: %w", stream, err)
	}
	for i, r := range recs {
		if r.Version != int64(i)+1 {
			return nil, fmt.Errorf("%w: %s has version %d where %d belongs", ErrTruncated, stream, r.Version, i+1)
		}
	}
	if int64(len(recs)) != last {
		return nil, fmt.Errorf("%w: %s holds %d of the %d events the read covers", ErrTruncated, stream, len(recs), last)
	}
	return recs, nil
}

// collectStream scans the rows of readStream: the version the read must
// end at (0 for a stream that does not exist) and the events.
func collectStream(rows pgx.Rows) ([]Record, int64, error) {
	defer rows.Close()
	var out []Record
	var last int64
	for rows.Next() {
		var r Record
		if err := rows.Scan(&last, &r.Position, &r.CommitKey, &r.TenantID, &r.StreamType, &r.StreamID, &r.Version,
			&r.Type, &r.TypeVersion, (*[]byte)(&r.Payload), &r.Metadata, &r.CreatedAt); err != nil {
			return nil, 0, err
		}
		if r.Position == 0 {
			continue // the stream's head row, with no event left
		}
		out = append(out, r)
	}
	return out, last, rows.Err()
}

const lockStream = `SELECT version FROM streams WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 FOR UPDATE`

// FetchForWriting locks the stream's head row (when the stream exists) and
// returns its events and version (0 for a new stream). Appending with that
// version as the expected version then cannot conflict within the
// transaction.
func FetchForWriting(ctx context.Context, db DB, stream StreamRef) ([]Record, int64, error) {
	var v int64
	err := db.QueryRow(ctx, lockStream, stream.TenantID, stream.Type, stream.ID).Scan(&v)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, fmt.Errorf("eventstore: lock stream %s: %w", stream, err)
	}
	if v == 0 {
		return nil, 0, nil
	}
	recs, err := ReadStream(ctx, db, stream, AsOf{})
	if err != nil {
		return nil, 0, err
	}
	if int64(len(recs)) != v {
		return nil, 0, fmt.Errorf("%w: %s is at version %d and holds %d events", ErrTruncated, stream, v, len(recs))
	}
	return recs, v, nil
}
