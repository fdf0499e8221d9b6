package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the event store needs of a connection or transaction; *pgx.Conn,
// pgx.Tx and *pgxpool.Pool all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Expected-version sentinels for [Append].
const (
	// AnyVersion appends whatever the stream's current version is.
	AnyVersion int64 = -1
	// NoStream appends only when the stream does not exist yet.
	NoStream int64 = 0
)

// StreamRef names one aggregate stream of one tenant.
type StreamRef struct {
	// TenantID owns the stream.
	TenantID string
	// Type is the aggregate type, e.g. "order".
	Type string
	// ID is the aggregate id within its type.
	ID string
}

// String renders the stream as "type/id".
func (s StreamRef) String() string { return s.Type + "/" + s.ID }

// Metadata travels with every event.
type Metadata struct {
	// UserID is the caller that caused the event ("" for system work).
	UserID string `json:"userId,omitempty"`
	// RequestID is the HTTP request id, when there was one.
	RequestID string `json:"requestId,omitempty"`
	// CorrelationID ties together everything one request caused.
	CorrelationID string `json:"correlationId,omitempty"`
	// CausationID is the id (position) of the event that caused this one, or
	// the request id for events written by a request.
	CausationID string `json:"causationId,omitempty"`
	// IdempotencyKey is the Idempotency-Key of the write that appended it.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
	// IdempotencyOwner is the owner token of the claim that key's write ran
	// under (the "owner" of the idempotency logs).
	IdempotencyOwner string `json:"idempotencyOwner,omitempty"`
	// IdempotencyReclaimedFrom is the owner whose claim of the key ran out
	// (its process died) before this owner took the key over and ran the
	// write again; empty for a write that ran under a fresh claim.
	IdempotencyReclaimedFrom string `json:"idempotencyReclaimedFrom,omitempty"`
}

// NewEvent is one event to append.
type NewEvent struct {
	// Type is the qualified event type, e.g. "orders:event:placed".
	Type string
	// TypeVersion is the payload schema version.
	TypeVersion int
	// Payload is the JSON payload.
	Payload json.RawMessage
	// Metadata is stored beside the payload.
	Metadata Metadata
}

// Cursor is a position in the log's delivery order. The zero Cursor is
// before every event.
type Cursor struct {
	// CommitKey is the event's commit key (an xid8).
	CommitKey uint64
	// Position is the event's position (its public id).
	Position int64
}

// Less reports whether c sorts before o.
func (c Cursor) Less(o Cursor) bool {
	return c.CommitKey < o.CommitKey || (c.CommitKey == o.CommitKey && c.Position < o.Position)
}

// String renders the cursor as "commitKey-position"; [ParseCursor] reverses it.
func (c Cursor) String() string {
	return strconv.FormatUint(c.CommitKey, 10) + "-" + strconv.FormatInt(c.Position, 10)
}

// ErrBadCursor is returned by [ParseCursor] for a malformed cursor.
var ErrBadCursor = errors.New("eventstore: malformed cursor")

// ParseCursor parses the form produced by [Cursor.String].
func ParseCursor(s string) (Cursor, error) {
	k, p, ok := strings.Cut(s, "-")
	if !ok {
		return Cursor{}, ErrBadCursor
	}
	ck, err := strconv.ParseUint(k, 10, 64)
	if err != nil {
		return Cursor{}, ErrBadCursor
	}
	pos, err := strconv.ParseInt(p, 10, 64)
	if err != nil || pos < 0 {
		return Cursor{}, ErrBadCursor
	}
	return Cursor{CommitKey: ck, Position: pos}, nil
}

// Record is one stored event.
type Record struct {
	// Position is the event's public id, unique in the log (not its
	// place in delivery order: see CommitKey).
	Position int64
	// CommitKey is the id (xid8) of the transaction that appended it; the
	// log is delivered in (CommitKey, Position) order.
	CommitKey uint64
	// TenantID owns the event's stream.
	TenantID string
	// StreamType is the aggregate type of its stream.
	StreamType string
	// StreamID is the aggregate id of its stream.
	StreamID string
	// Version is the event's version within its stream, from 1.
	Version int64
	// Type is the qualified event type.
	Type string
	// TypeVersion is the payload's schema version as stored.
	TypeVersion int
	// Payload is the JSON payload as stored.
	Payload json.RawMessage
	// Metadata is what travelled with the event.
	Metadata Metadata
	// CreatedAt is when the event was appended (its transaction's start).
	CreatedAt time.Time
}

// Cursor returns the record's place in delivery order.
func (r *Record) Cursor() Cursor { return Cursor{CommitKey: r.CommitKey, Position: r.Position} }

// Stream returns the record's stream.
func (r *Record) Stream() StreamRef {
	return StreamRef{TenantID: r.TenantID, Type: r.StreamType, ID: r.StreamID}
}

// Appended reports where one appended event landed.
type Appended struct {
	// Position is the event's public id.
	Position int64
	// Version is its version within its stream.
	Version int64
	// CommitKey is the id of the appending transaction.
	CommitKey uint64
	// CreatedAt is its creation time.
	CreatedAt time.Time
}

// ConcurrencyError reports an expected-version mismatch.
type ConcurrencyError struct {
	// Stream is the stream appended to.
	Stream StreamRef
	// Expected is the version the append expected ([NoStream] for a new
	// stream).
	Expected int64
	// Actual is the stream's version when known, else -1 (always for a
	// [NoStream] append to an existing stream).
	Actual int64
}

// Error names the stream and both versions.
func (e *ConcurrencyError) Error() string {
	if e.Expected == NoStream {
		return fmt.Sprintf("eventstore: stream %s exists, expected a new stream", e.Stream)
	}
	return fmt.Sprintf("eventstore: stream %s: expected version %d, actual %d", e.Stream, e.Expected, e.Actual)
}

// The append statements. Each locks the stream's head row first (the CTE s
// or g) and draws positions after that lock (the position column's default,
// nextval of kumiko_event_position_seq, evaluated per inserted row; the
// tenant role may not name the column: migration 00012); EXCLUDED.version / $4 carries
// the number of events. A conflict must abort the transaction, or a COMMIT
// pipelined behind a zero-row append would commit the business writes
// without their events: for an expected version the guard branch calls
// kumiko_version_conflict when s is empty, which raises SQLSTATE KU409; a new
// stream is a plain INSERT, whose unique violation on an existing stream does
// the same.
const (
	appendInsertTail = `
INSERT INTO events (commit_key, tenant_id, stream_type, stream_id, version, type, type_version, payload, metadata)
SELECT g.last_commit_key, $1, $2, $3, g.version - $4 + e.ord, e.type, e.type_version, e.payload, e.metadata
FROM g, unnest($5::text[], $6::int[], $7::jsonb[], $8::jsonb[]) WITH ORDINALITY AS e(type, type_version, payload, metadata, ord)
RETURNING position, version, commit_key, created_at`

	// appendInsertOne is appendInsertTail for one event: scalars instead of
	// arrays, so neither side builds, sends and unpacks them.
	appendInsertOne = `
INSERT INTO events (commit_key, tenant_id, stream_type, stream_id, version, type, type_version, payload, metadata)
SELECT g.last_commit_key, $1, $2, $3, g.version, $5::text, $6::int, $7::jsonb, $8::jsonb
FROM g
RETURNING position, version, commit_key, created_at`

	guard = `,
g AS (
  SELECT version, last_commit_key FROM s
  UNION ALL
  SELECT kumiko_version_conflict($1, $2, $3, $9), NULL::xid8 WHERE NOT EXISTS (SELECT FROM s)
)`

	// appendAny appends at whatever version the stream has.
	appendAnyHead = `WITH g AS (
  INSERT INTO streams AS st (tenant_id, stream_type, stream_id, version, last_commit_key)
  VALUES ($1, $2, $3, $4, pg_current_xact_id())
  ON CONFLICT (tenant_id, stream_type, stream_id) DO UPDATE
     SET version = st.version + EXCLUDED.version,
         last_commit_key = GREATEST(pg_current_xact_id(), st.last_commit_key)
  RETURNING st.version, st.last_commit_key
)`

	// appendExpected is an UPDATE guarded by the version (an ON CONFLICT ...
	// WHERE never fires when the insert returns nothing).
	appendExpectedHead = `WITH s AS (
  UPDATE streams SET version = version + $4,
         last_commit_key = GREATEST(pg_current_xact_id(), last_commit_key)
  WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 AND version = $9
  RETURNING version, last_commit_key
)` + guard

	// appendNew creates the stream; when it exists the INSERT fails with a
	// unique violation (23505 on streams). Neither ON CONFLICT (a speculative
	// insertion) nor the guard's second branch: a measured 6% of the database
	// CPU of a transaction that writes one row and one event.
	appendNewHead = `WITH g AS (
  INSERT INTO streams (tenant_id, stream_type, stream_id, version, last_commit_key)
  VALUES ($1, $2, $3, $4, pg_current_xact_id())
  RETURNING version, last_commit_key
)`
)

// The statements by expected-version shape, for several events and for one.
const (
	appendAny         = appendAnyHead + appendInsertTail
	appendAnyOne      = appendAnyHead + appendInsertOne
	appendExpected    = appendExpectedHead + appendInsertTail
	appendExpectedOne = appendExpectedHead + appendInsertOne
	appendNew         = appendNewHead + appendInsertTail
	appendNewOne      = appendNewHead + appendInsertOne
)

// ErrEmptyAppend is returned when an append carries no events.
var ErrEmptyAppend = errors.New("eventstore: append of no events")

// appendArgs returns the statement and arguments of one stream's append.
func appendArgs(stream StreamRef, expected int64, events []NewEvent) (string, []any, error) {
	if len(events) == 0 {
		return "", nil, ErrEmptyAppend
	}
	if stream.TenantID == "" || stream.Type == "" || stream.ID == "" {
		return "", nil, fmt.Errorf("eventstore: incomplete stream %q/%q/%q", stream.TenantID, stream.Type, stream.ID)
	}
	if expected < AnyVersion {
		return "", nil, fmt.Errorf("eventstore: invalid expected version %d", expected)
	}
	if len(events) == 1 {
		return appendOneArgs(stream, expected, events[0])
	}
	types := make([]string, len(events))
	versions := make([]int32, len(events))
	payloads := make([]string, len(events))
	metas := make([]string, len(events))
	for i, e := range events {
		v, err := typeVersion(e)
		if err != nil {
			return "", nil, err
		}
		types[i] = e.Type
		versions[i] = v
		payloads[i] = string(e.Payload)
		if len(e.Payload) == 0 {
			payloads[i] = "{}"
		}
		m, err := json.Marshal(e.Metadata)
		if err != nil {
			return "", nil, fmt.Errorf("eventstore: metadata: %w", err)
		}
		metas[i] = string(m)
	}
	args := []any{stream.TenantID, stream.Type, stream.ID, int64(len(events)), types, versions, payloads, metas}
	switch expected {
	case AnyVersion:
		return appendAny, args, nil
	case NoStream:
		return appendNew, args, nil
	default:
		return appendExpected, append(args, expected), nil
	}
}

// MaxTypeVersion is the largest payload schema version the log stores (an
// int4).
const MaxTypeVersion = math.MaxInt32

// typeVersion checks that e names its type and returns its schema version
// as stored (an int4; below 1 means 1).
func typeVersion(e NewEvent) (int32, error) {
	if e.Type == "" {
		return 0, errors.New("eventstore: event without type")
	}
	if e.TypeVersion > MaxTypeVersion {
		return 0, fmt.Errorf("eventstore: %s: type version %d does not fit the log", e.Type, e.TypeVersion)
	}
	return int32(max(e.TypeVersion, 1)), nil
}

// appendOneArgs is appendArgs for a single event.
func appendOneArgs(stream StreamRef, expected int64, e NewEvent) (string, []any, error) {
	version, err := typeVersion(e)
	if err != nil {
		return "", nil, err
	}
	payload := e.Payload
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	m, err := json.Marshal(e.Metadata)
	if err != nil {
		return "", nil, fmt.Errorf("eventstore: metadata: %w", err)
	}
	// []byte travels to jsonb as the JSON text itself.
	args := []any{stream.TenantID, stream.Type, stream.ID, int64(1), e.Type, version, []byte(payload), m, expected}
	switch expected {
	case AnyVersion:
		return appendAnyOne, args[:8], nil
	case NoStream:
		return appendNewOne, args[:8], nil
	default:
		return appendExpectedOne, args, nil
	}
}

// scanAppended reads the RETURNING rows and checks that every event landed.
func scanAppended(rows pgx.Rows, stream StreamRef, expected int64, n int) ([]Appended, error) {
	out := make([]Appended, 0, n)
	for rows.Next() {
		var a Appended
		if err := rows.Scan(&a.Position, &a.Version, &a.CommitKey, &a.CreatedAt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("eventstore: scan append: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			switch {
			case pgErr.Code == "KU409":
				actual, perr := strconv.ParseInt(pgErr.Detail, 10, 64)
				if perr != nil {
					actual = -1
				}
				return nil, &ConcurrencyError{Stream: stream, Expected: expected, Actual: actual}
			case pgErr.Code == "23505" && (pgErr.TableName == "events" || pgErr.TableName == "streams"):
				// streams: a new stream that exists, at a version the
				// aborted transaction can no longer read.
				return nil, &ConcurrencyError{Stream: stream, Expected: expected, Actual: -1}
			}
		}
		return nil, fmt.Errorf("eventstore: append to %s: %w", stream, err)
	}
	if len(out) != n {
		return nil, &ConcurrencyError{Stream: stream, Expected: expected, Actual: -1}
	}
	return out, nil
}

// Append appends events to one stream inside the caller's transaction. With
// an expected version other than [AnyVersion] it fails with a
// *[ConcurrencyError] when the stream's version differs ([NoStream]: when the
// stream exists). The caller's transaction must then be rolled back.
func Append(ctx context.Context, db DB, stream StreamRef, expected int64, events []NewEvent) ([]Appended, error) {
	sql, args, err := appendArgs(stream, expected, events)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("eventstore: append to %s: %w", stream, err)
	}
	return scanAppended(rows, stream, expected, len(events))
}

// QueueAppend queues one stream's append on a pgx batch, so that appends can
// travel in one round trip with other statements (and the COMMIT). done is
// called with the outcome when the batch's results are read. A conflict
// raises an error in the server, so statements queued after it (a COMMIT)
// do not run.
func QueueAppend(b *pgx.Batch, stream StreamRef, expected int64, events []NewEvent, done func([]Appended, error) error) error {
	sql, args, err := appendArgs(stream, expected, events)
	if err != nil {
		return err
	}
	n := len(events)
	b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		out, err := scanAppended(rows, stream, expected, n)
		return done(out, err)
	})
	return nil
}

// SortStreams orders stream references the way every multi-stream append must
// lock them, to rule out deadlocks between writers.
func SortStreams(a, b StreamRef) int {
	if c := strings.Compare(a.TenantID, b.TenantID); c != 0 {
		return c
	}
	if c := strings.Compare(a.Type, b.Type); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}
