package dispatcher

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// State is a consumer's state as operators see it.
type State string

// The consumer states. Idle, dead and disabled are stored; processing is
// derived: an idle consumer whose pass holds its advisory lock right now.
const (
	// StateIdle: ready, the next pass delivers new events.
	StateIdle State = "idle"
	// StateProcessing: a pass is running (it holds the consumer's lock).
	StateProcessing State = "processing"
	// StateDead: the same event failed MaxAttempts times; delivery is paused
	// until [Restart], [Skip] or [Rewind] (or an automatic revival).
	StateDead State = "dead"
	// StateDisabled: an operator parked the consumer; paused until [Enable].
	StateDisabled State = "disabled"
)

// OpsLockTimeout bounds how long an ops verb waits for a running pass of
// the consumer to finish, or for an events prune (which holds the consumer
// table until it commits); after it the verb fails with [ErrConsumerBusy].
const OpsLockTimeout = 30 * time.Second

// opsLockTimeout is OpsLockTimeout as a duration's nanoseconds; tests
// shorten it.
var opsLockTimeout atomic.Int64

func init() { opsLockTimeout.Store(int64(OpsLockTimeout)) }

// StatusDeadLetters is how many of the newest dead letters [Status] returns.
const StatusDeadLetters = 10

// ErrConsumerNotFound is returned (wrapped) when no state row exists for the
// consumer name and instance id.
var ErrConsumerNotFound = errors.New("dispatcher: consumer not found")

// ErrNothingToSkip is returned (wrapped) by [Skip] when the consumer has no
// recorded failing event and no visible event of its types after its cursor,
// and when its recorded failing event is not its to skip: pruned, of a type
// it no longer consumes, or behind events of types it took on since the
// failure, which it must be delivered first.
var ErrNothingToSkip = errors.New("dispatcher: nothing to skip")

// ErrEventNotFound is returned (wrapped) by [Rewind] when no event has the
// target position, or no event was created at or after the target time.
var ErrEventNotFound = errors.New("dispatcher: no such event")

// ErrRewindForward is returned (wrapped) by [Rewind] when the target lies
// after the consumer's cursor: moving forward would drop events silently
// (use [Skip] to move past one event).
var ErrRewindForward = errors.New("dispatcher: rewind target is after the cursor")

// ErrConsumerBusy is returned (wrapped) when a pass of the consumer held its
// lock for longer than [OpsLockTimeout].
var ErrConsumerBusy = errors.New("dispatcher: consumer is busy")

// ErrInstanceAlive is returned (wrapped) by [RemoveInstance] when the
// instance's rows had a heartbeat within [RemoveInstanceMinSilence].
var ErrInstanceAlive = errors.New("dispatcher: instance is alive")

// ErrSharedInstance is returned (wrapped) by [RemoveInstance] for
// [SharedInstance] or an empty id: neither names a process.
var ErrSharedInstance = errors.New("dispatcher: not a per-instance id")

// StateError is an ops verb's refusal of the consumer's current state, e.g.
// restarting a consumer that is not dead.
type StateError struct {
	// Name is the consumer's name.
	Name string
	// Instance is the state row's instance id.
	Instance string
	// Verb is the refused verb ("restart", "enable", ...).
	Verb string
	// Status is the consumer's current state.
	Status State
	// Want names the state(s) the verb needs, e.g. "dead".
	Want string
}

// Error says what the state is and what the verb needs, e.g. "consumer
// orders:order-totals is idle; restart needs dead".
func (e *StateError) Error() string {
	return fmt.Sprintf("consumer %s is %s; %s needs %s", label(e.Name, e.Instance), e.Status, e.Verb, e.Want)
}

// SSEConsumerName is the per-instance consumer that feeds a process's live
// SSE streams (framework/sse's ConsumerName, a package built on this one):
// what it moves past, its process's live clients never get.
const SSEConsumerName = "system:consumer:sse-broadcast"

// ErrLiveStreamConsumer is returned (wrapped) by [Skip] and [Disable] on a
// row of [SSEConsumerName] when the verb would take events from the live
// streams of its process without their clients knowing: a skip while the
// consumer is not failing at the event, and every disable.
var ErrLiveStreamConsumer = errors.New("dispatcher: the consumer feeds live SSE streams")

// ErrRebuildConsumer is returned (wrapped) by restart, enable, skip and
// rewind on a projection rebuild's temporary consumer (NAME#rebuild): its
// cursor belongs to the rebuild.
var ErrRebuildConsumer = errors.New("dispatcher: a projection rebuild's consumer")

// rebuildSuffix ends the name of a projection rebuild's temporary consumer
// (rebuild.ConsumerName, a package built on this one).
const rebuildSuffix = "#rebuild"

// opError is a refusal with a readable message that matches a sentinel.
type opError struct {
	msg  string
	kind error
}

func (e *opError) Error() string { return e.msg }
func (e *opError) Unwrap() error { return e.kind }

// label names a state row for messages: the name alone for shared
// consumers, with the instance id otherwise; each an [framework.Excerpt]
// (an operator's or an HTTP client's value, repeated in refusals).
func label(name, instance string) string {
	if instance == SharedInstance || instance == "" {
		return framework.Excerpt(name)
	}
	return framework.Excerpt(name) + " (instance " + framework.Excerpt(instance) + ")"
}

// ConsumerStatus is one consumer state row (name, instance id) as operators
// see it.
type ConsumerStatus struct {
	// Name is the consumer's name.
	Name string `json:"name"`
	// InstanceID is [SharedInstance] for shared delivery, else the process's
	// instance id.
	InstanceID string `json:"instanceId"`
	// Status is idle, processing, dead or disabled.
	Status State `json:"status"`
	// EventTypes the consumer reads; nil means every type.
	EventTypes []string `json:"eventTypes"`
	// Partition is the row's partition of Partitions (0 of 1 for an
	// unpartitioned consumer): it reads the events of the streams that hash
	// to it (see [Consumer.Partitions]).
	Partition int `json:"partition"`
	// Partitions is how many partitions the consumer has.
	Partitions int `json:"partitions"`
	// Cursor is the place of the last event the consumer moved past.
	Cursor eventstore.Cursor `json:"-"`
	// Lag counts the events of the consumer's types after its cursor,
	// including those not yet visible, up to [LagCountCap].
	Lag int64 `json:"lag"`
	// LagCapped is set when the count stopped at [LagCountCap]: the lag is
	// at least Lag.
	LagCapped bool `json:"lagCapped,omitempty"`
	// Attempts is how often the failing event has failed in a row.
	Attempts int `json:"attempts"`
	// FailedPosition is the position of the failing event, if any.
	FailedPosition *int64 `json:"failedPosition,omitempty"`
	// LastError is the failing event's last error, if any.
	LastError string `json:"lastError,omitempty"`
	// NextAttemptAt is when the failing event is retried, if a retry is
	// due (never for a dead or disabled consumer).
	NextAttemptAt *time.Time `json:"nextAttemptAt,omitempty"`
	// DeadSince is when the consumer turned dead, if it is dead.
	DeadSince *time.Time `json:"deadSince,omitempty"`
	// Revivals counts automatic revivals since the last successful delivery.
	Revivals int `json:"revivals"`
	// EventsProcessed counts the events delivered over the row's life.
	EventsProcessed int64 `json:"eventsProcessed"`
	// HeartbeatAt is the last heartbeat (per-instance rows) or registration.
	HeartbeatAt time.Time `json:"heartbeatAt"`
	// HeartbeatAge is how long ago HeartbeatAt was, by the database's clock.
	HeartbeatAge time.Duration `json:"-"`
	// UpdatedAt is the state row's last change.
	UpdatedAt time.Time `json:"updatedAt"`
	// DeadLetters are the newest dead letters, newest first; only [Status]
	// fills them.
	DeadLetters []DeadLetter `json:"deadLetters,omitempty"`
}

// MarshalJSON renders the cursor as its string form ("cursor") and its
// position ("cursorPosition"), and the heartbeat age in seconds
// ("heartbeatAgeSeconds").
func (s ConsumerStatus) MarshalJSON() ([]byte, error) {
	type plain ConsumerStatus
	return json.Marshal(struct {
		plain
		Cursor              string  `json:"cursor"`
		CursorPosition      int64   `json:"cursorPosition"`
		HeartbeatAgeSeconds float64 `json:"heartbeatAgeSeconds"`
	}{plain(s), s.Cursor.String(), s.Cursor.Position, s.HeartbeatAge.Seconds()})
}

// DeadLetter is an event a consumer moved past without delivering it
// (SkipApplyErrors, or an operator's [Skip]).
type DeadLetter struct {
	// ID is the dead letter's id.
	ID int64 `json:"id"`
	// Position is the event's position.
	Position int64 `json:"position"`
	// EventType is the event's type.
	EventType string `json:"eventType"`
	// TenantID is the event's tenant.
	TenantID string `json:"tenantId"`
	// Error is the handler's error, or "skipped by operator" (followed by
	// the last handler error, if one was recorded).
	Error string `json:"error"`
	// CreatedAt is when the event was moved past.
	CreatedAt time.Time `json:"createdAt"`
}

// LagCountCap is where [List] and [Status] stop counting a row's lag: a
// row far behind (a removed consumer's row, disabled, whose cursor stays
// while the log grows) would otherwise cost a scan of every event after
// its cursor on each call, and the admin page calls List every 2 seconds.
// The lag gauge of the dispatcher counts further.
const LagCountCap = 100_000

// statusSQL reads state rows with the derived processing flag (a granted
// advisory lock on the row's key, the pass's lock) and the lag, counted up
// to $3 (the cap plus one).
const statusSQL = `WITH held AS (
  SELECT (l.classid::int8 << 32) | l.objid::int8 AS key FROM pg_locks l
  WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
    AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
SELECT c.name, c.instance_id, c.status, c.event_types, c.cursor_commit_key, c.cursor_position,
  c.attempts, c.failed_position, coalesce(c.last_error, ''), c.next_attempt_at, c.dead_at, c.revivals,
  c.events_processed, c.heartbeat_at, extract(epoch FROM now() - c.heartbeat_at)::float8, c.updated_at,
  hashtextextended(c.name || chr(31) || c.instance_id, 0) IN (SELECT key FROM held),
  c.partition_index, c.partition_count,
  (SELECT count(*) FROM (SELECT 1 FROM events e
    WHERE (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
      AND (c.event_types IS NULL OR e.type = ANY(c.event_types))
      AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index)
    LIMIT $3) x)
FROM event_consumers c
WHERE ($1::text IS NULL OR (c.name = $1 AND c.instance_id = $2))
ORDER BY c.name, c.instance_id`

const deadLettersSQL = `SELECT id, position, event_type, tenant_id, error, created_at
FROM event_dead_letters WHERE consumer = $1 AND instance_id = $2
ORDER BY id DESC LIMIT $3`

// List returns every consumer state row (one per name and instance id),
// ordered by name and instance id.
func List(ctx context.Context, pool *pgxpool.Pool) ([]ConsumerStatus, error) {
	out, err := queryStatus(ctx, pool, nil, "", LagCountCap)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: list consumers: %w", err)
	}
	return out, nil
}

// Status returns one consumer's state row with its newest
// [StatusDeadLetters] dead letters. An empty instance means
// [SharedInstance]. It returns [ErrConsumerNotFound] (wrapped) when the row
// does not exist.
func Status(ctx context.Context, pool *pgxpool.Pool, name, instance string) (ConsumerStatus, error) {
	instance = cmp.Or(instance, SharedInstance)
	rows, err := queryStatus(ctx, pool, &name, instance, LagCountCap)
	if err != nil {
		return ConsumerStatus{}, fmt.Errorf("dispatcher: consumer status: %w", err)
	}
	if len(rows) == 0 {
		return ConsumerStatus{}, notFound(ctx, pool, name, instance)
	}
	st := rows[0]
	dl, err := pool.Query(ctx, deadLettersSQL, name, instance, StatusDeadLetters)
	if err != nil {
		return ConsumerStatus{}, fmt.Errorf("dispatcher: consumer status: dead letters: %w", err)
	}
	st.DeadLetters, err = pgx.CollectRows(dl, func(r pgx.CollectableRow) (DeadLetter, error) {
		var d DeadLetter
		err := r.Scan(&d.ID, &d.Position, &d.EventType, &d.TenantID, &d.Error, &d.CreatedAt)
		return d, err
	})
	if err != nil {
		return ConsumerStatus{}, fmt.Errorf("dispatcher: consumer status: dead letters: %w", err)
	}
	return st, nil
}

func queryStatus(ctx context.Context, pool *pgxpool.Pool, name *string, instance string, lagCap int64) (out []ConsumerStatus, err error) {
	// Postgres misjudges how many events lie after a cursor and plans a
	// bitmap scan, which reads every index entry after it before the LIMIT
	// applies; an index scan in cursor order stops at the cap.
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL enable_bitmapscan = off`); err != nil {
			return err
		}
		// One more than the cap tells a lag of exactly lagCap from a larger one.
		rows, err := tx.Query(ctx, statusSQL, name, instance, lagCap+1)
		if err != nil {
			return err
		}
		out, err = collectStatus(rows, lagCap)
		return err
	})
	return out, err
}

// collectStatus scans the rows of statusSQL.
func collectStatus(rows pgx.Rows, lagCap int64) ([]ConsumerStatus, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerStatus, error) {
		var s ConsumerStatus
		var status string
		var ageSecs float64
		var processing bool
		err := r.Scan(&s.Name, &s.InstanceID, &status, &s.EventTypes, &s.Cursor.CommitKey, &s.Cursor.Position,
			&s.Attempts, &s.FailedPosition, &s.LastError, &s.NextAttemptAt, &s.DeadSince, &s.Revivals,
			&s.EventsProcessed, &s.HeartbeatAt, &ageSecs, &s.UpdatedAt, &processing, &s.Partition, &s.Partitions, &s.Lag)
		s.Status = State(status)
		if processing && s.Status == StateIdle {
			s.Status = StateProcessing
		}
		// The row keeps a dead consumer's last backoff and, once it is
		// disabled, its time of death: neither is a retry to come nor a
		// death now.
		if s.Status == StateDead || s.Status == StateDisabled {
			s.NextAttemptAt = nil
		}
		if s.Status != StateDead {
			s.DeadSince = nil
		}
		s.HeartbeatAge = time.Duration(ageSecs * float64(time.Second))
		if s.Lag > lagCap {
			s.Lag, s.LagCapped = lagCap, true
		}
		return s, err
	})
}

// partitionCountSQL counts the partition rows of a consumer named $1.
const partitionCountSQL = `SELECT count(*) FROM event_consumers
WHERE instance_id = $2 AND starts_with(name, $1 || '@') AND substr(name, length($1) + 2) ~ '^[0-9]+$'`

// notFound is the error for a missing state row; when the name is that of
// a partitioned consumer, it names the partitions' rows instead, and when
// the name has rows under other instance ids (a per-instance consumer named
// without its instance, a shared one with an instance), it names those.
func notFound(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, name, instance string) error {
	var parts int
	if err := db.QueryRow(ctx, partitionCountSQL, name, instance).Scan(&parts); err == nil && parts > 0 {
		return &opError{msg: fmt.Sprintf("consumer %s is partitioned: name one of its %d partitions, %s to %s",
			label(name, instance), parts, PartitionName(name, 0), PartitionName(name, parts-1)), kind: ErrConsumerNotFound}
	}
	// The name may have rows under other instance ids: a per-instance
	// consumer named without its instance, or a shared one with one.
	rows, err := db.Query(ctx, otherInstancesSQL, name, instance, maxNamedInstances+1)
	if err == nil {
		others, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err == nil && len(others) > 0 {
			list := instanceList(others)
			switch {
			case others[0] == SharedInstance:
				return &opError{msg: fmt.Sprintf("consumer %s not found: %s is shared, leave the instance out",
					label(name, instance), framework.Excerpt(name)), kind: ErrConsumerNotFound}
			case instance == SharedInstance:
				return &opError{msg: fmt.Sprintf("consumer %s has no shared row: it is per-instance, name one of its instances: %s",
					label(name, instance), list), kind: ErrConsumerNotFound}
			default:
				return &opError{msg: fmt.Sprintf("consumer %s not found; its instances: %s", label(name, instance), list),
					kind: ErrConsumerNotFound}
			}
		}
	}
	return &opError{msg: fmt.Sprintf("consumer %s not found", label(name, instance)), kind: ErrConsumerNotFound}
}

// otherInstancesSQL lists the instance ids other than $2 with a row named
// $1, the shared one first, up to $3.
const otherInstancesSQL = `SELECT instance_id FROM event_consumers WHERE name = $1 AND instance_id <> $2
ORDER BY instance_id <> '__shared__', instance_id LIMIT $3`

// maxNamedInstances bounds how many instance ids a "not found" names.
const maxNamedInstances = 5

// instanceList joins instance ids for a message: at most
// maxNamedInstances of them, "..." when there are more.
func instanceList(ids []string) string {
	var b strings.Builder
	for i, id := range ids {
		if i == maxNamedInstances {
			b.WriteString(", ...")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(framework.Excerpt(id))
	}
	return b.String()
}

// opRow is the part of a state row the verbs decide on.
type opRow struct {
	name, instance string
	status         State
	cursor         eventstore.Cursor
	eventTypes     []string
	failedPosition *int64
	lastError      *string
	attempts       int
	// partIndex of partCount: the row's share of the streams.
	partIndex, partCount int
}

const (
	opsLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
	opsRowSQL  = `SELECT status, cursor_commit_key, cursor_position, event_types, failed_position, last_error,
  partition_index, partition_count, attempts
FROM event_consumers WHERE name = $1 AND instance_id = $2 FOR UPDATE`
)

// withConsumer runs fn in a transaction that holds the consumer's advisory
// lock (the lock a pass takes, so no pass runs meanwhile and none can
// overwrite the change) and the state row's row lock, and commits when fn
// returns nil.
func withConsumer(ctx context.Context, pool *pgxpool.Pool, verb, name, instance string, fn func(tx pgx.Tx, row opRow) error) error {
	if projection, ok := strings.CutSuffix(name, rebuildSuffix); ok && verb != "disable" {
		// Only the rebuild runs this row; skip or rewind would drop or
		// repeat events in the table it builds, restart or enable run
		// nothing. Disable stops a running rebuild.
		return &opError{msg: fmt.Sprintf("consumer %s is a projection rebuild's temporary consumer: %s would drop or repeat events in the table it builds, or run nothing; "+
			"let the rebuild finish, disable the row to stop it, or remove a killed rebuild's leftover with `kumiko projection rebuild %s --abandon`",
			framework.Excerpt(name), verb, framework.Excerpt(projection)), kind: ErrRebuildConsumer}
	}
	instance = cmp.Or(instance, SharedInstance)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		timeout := time.Duration(opsLockTimeout.Load())
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, timeout.Milliseconds())); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, opsLockSQL, LockKey(name, instance)); err != nil {
			if lockTimedOut(err) {
				return &opError{msg: fmt.Sprintf("consumer %s is still processing a pass after %s; try again", label(name, instance), timeout), kind: ErrConsumerBusy}
			}
			return err
		}
		row := opRow{name: name, instance: instance}
		var status string
		err := tx.QueryRow(ctx, opsRowSQL, name, instance).Scan(&status, &row.cursor.CommitKey, &row.cursor.Position,
			&row.eventTypes, &row.failedPosition, &row.lastError, &row.partIndex, &row.partCount, &row.attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound(ctx, tx, name, instance)
		}
		if err != nil {
			return err
		}
		row.status = State(status)
		return fn(tx, row)
	})
	if err != nil {
		var oe *opError
		var se *StateError
		if errors.As(err, &oe) || errors.As(err, &se) {
			return err
		}
		if lockTimedOut(err) {
			// Past the consumer's lock, only a table lock waits that long:
			// an events prune holds the consumer table until it commits.
			return &opError{msg: fmt.Sprintf("consumer %s: the consumer table stayed locked for %s (an events prune is running?); try again",
				label(name, instance), time.Duration(opsLockTimeout.Load())), kind: ErrConsumerBusy}
		}
		return fmt.Errorf("dispatcher: %s %s: %w", verb, label(name, instance), err)
	}
	return nil
}

// lockTimedOut reports a statement cancelled by lock_timeout.
func lockTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03" // lock_not_available
}

// Restart turns a dead consumer idle with its cursor unchanged and its
// attempts reset, so the next pass retries the failing event (with a fresh
// MaxAttempts budget and automatic-revival budget). An empty instance means
// [SharedInstance]. It refuses every state but dead with a *[StateError],
// and returns [ErrConsumerNotFound] (wrapped) for an unknown consumer.
func Restart(ctx context.Context, pool *pgxpool.Pool, name, instance string) error {
	return withConsumer(ctx, pool, "restart", name, instance, func(tx pgx.Tx, row opRow) error {
		if row.status != StateDead {
			return &StateError{Name: name, Instance: row.instance, Verb: "restart", Status: row.status, Want: "dead"}
		}
		_, err := tx.Exec(ctx, `UPDATE event_consumers SET status = 'idle', attempts = 0, next_attempt_at = NULL,
  dead_at = NULL, revivals = 0, updated_at = now()
WHERE name = $1 AND instance_id = $2`, name, row.instance)
		return err
	})
}

// Disable parks an idle or dead consumer: no pass delivers to it until
// [Enable]. Its cursor and failure record stay as they are. An empty
// instance means [SharedInstance]. It refuses a disabled consumer with a
// *[StateError], [SSEConsumerName] with [ErrLiveStreamConsumer] (wrapped:
// its process's live streams would stay open without events, and a
// disabled row holds no prune back), and returns [ErrConsumerNotFound]
// (wrapped) for an unknown consumer.
func Disable(ctx context.Context, pool *pgxpool.Pool, name, instance string) error {
	return withConsumer(ctx, pool, "disable", name, instance, func(tx pgx.Tx, row opRow) error {
		if name == SSEConsumerName {
			return &opError{msg: fmt.Sprintf("consumer %s feeds the live SSE streams of its process: disabled, it would leave them open "+
				"without events, their clients unaware, and a prune would not wait for it; to stop them, drain or stop that process "+
				"(its clients resume on the others, by replay); a dead one: restart it, or skip the event it fails at",
				label(name, row.instance)), kind: ErrLiveStreamConsumer}
		}
		if row.status == StateDisabled {
			return &StateError{Name: name, Instance: row.instance, Verb: "disable", Status: row.status, Want: "idle or dead"}
		}
		_, err := tx.Exec(ctx, `UPDATE event_consumers SET status = 'disabled', updated_at = now()
WHERE name = $1 AND instance_id = $2`, name, row.instance)
		return err
	})
}

// Enable turns a disabled consumer idle; the next pass resumes at its
// cursor. Attempts are kept: a consumer disabled while dead retries its
// failing event once and turns dead again if it still fails. An empty
// instance means [SharedInstance]. It refuses every state but disabled with
// a *[StateError], and returns [ErrConsumerNotFound] (wrapped) for an
// unknown consumer.
func Enable(ctx context.Context, pool *pgxpool.Pool, name, instance string) error {
	return withConsumer(ctx, pool, "enable", name, instance, func(tx pgx.Tx, row opRow) error {
		if row.status != StateDisabled {
			return &StateError{Name: name, Instance: row.instance, Verb: "enable", Status: row.status, Want: "disabled"}
		}
		_, err := tx.Exec(ctx, `UPDATE event_consumers SET status = 'idle', next_attempt_at = NULL, dead_at = NULL, updated_at = now()
WHERE name = $1 AND instance_id = $2`, name, row.instance)
		return err
	})
}

const (
	skipFailedSQL = `SELECT position, commit_key, type, tenant_id FROM events
WHERE position = $1 AND (commit_key, position) > ($2::xid8, $3::bigint)`
	skipGoneSQL = `SELECT NOT EXISTS (SELECT 1 FROM events WHERE position = $1)`
	// skipBetweenSQL looks for events of the consumer's types and partition
	// between its cursor and its failing event: none, unless its types
	// changed since the failure was recorded (they were not its types
	// then, so the pass that failed did not deliver them).
	skipBetweenSQL = `SELECT EXISTS (SELECT 1 FROM events
WHERE (commit_key, position) > ($1::xid8, $2::bigint) AND (commit_key, position) < ($3::xid8, $4::bigint)
  AND ($5::text[] IS NULL OR type = ANY($5))
  AND ($7::int = 1 OR kumiko_stream_partition(stream_id, $7) = $6))`
	skipNextSQL = `SELECT position, commit_key, type, tenant_id FROM events
WHERE (commit_key, position) > ($1::xid8, $2::bigint)
  AND commit_key < pg_snapshot_xmin(pg_current_snapshot())
  AND ($3::text[] IS NULL OR type = ANY($3))
  AND ($5::int = 1 OR kumiko_stream_partition(stream_id, $5) = $4)
ORDER BY commit_key, position LIMIT 1`
	skipDeadLetterSQL = `INSERT INTO event_dead_letters (consumer, instance_id, position, event_type, tenant_id, error)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING id, created_at`
	skipUpdateSQL = `UPDATE event_consumers SET cursor_commit_key = $3, cursor_position = $4,
  status = CASE WHEN status = 'dead' THEN 'idle' ELSE status END,
  attempts = 0, failed_position = NULL, last_error = NULL, next_attempt_at = NULL,
  dead_at = NULL, revivals = 0, updated_at = now()
WHERE name = $1 AND instance_id = $2`
)

// SkippedByOperator starts the error of a dead letter written by [Skip].
const SkippedByOperator = "skipped by operator"

// Skip moves the consumer's cursor past its poison event and records that
// event in event_dead_letters with the error "skipped by operator" (plus the
// last handler error, if one was recorded). The poison event is the
// recorded failing event (failed position) when it lies after the cursor,
// else the next visible event of the consumer's types after the cursor; a
// recorded failing event that no longer exists (pruned) is refused with
// [ErrNothingToSkip] rather than standing in the next event for it. So is a
// recorded failing event after the consumer's event types changed (a new
// release registered it): one of a type it no longer consumes, and one
// behind events of its new types, which the skip would pass by undelivered
// (a restart delivers them first).
// Attempts and the failure record are reset; a dead consumer turns idle, a
// disabled one stays disabled. An empty instance means [SharedInstance].
// [SSEConsumerName] is skipped only past an event it is failing at (a
// recorded failure that counted an attempt): otherwise the skip would pass
// over an event that its process's live clients then miss without knowing,
// and it is refused with [ErrLiveStreamConsumer] (wrapped).
// It returns the dead letter; [ErrNothingToSkip] (wrapped) when there is no
// such event; [ErrConsumerNotFound] (wrapped) for an unknown consumer.
func Skip(ctx context.Context, pool *pgxpool.Pool, name, instance string) (DeadLetter, error) {
	var dl DeadLetter
	err := withConsumer(ctx, pool, "skip", name, instance, func(tx pgx.Tx, row opRow) error {
		live := name == SSEConsumerName
		if live && (row.failedPosition == nil || row.attempts == 0) {
			return liveSkipRefused(row)
		}
		var ck uint64
		found := false
		if row.failedPosition != nil {
			err := tx.QueryRow(ctx, skipFailedSQL, *row.failedPosition, row.cursor.CommitKey, row.cursor.Position).
				Scan(&dl.Position, &ck, &dl.EventType, &dl.TenantID)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			found = err == nil
			if found {
				if err := skipRecordedSafe(ctx, tx, row, dl.EventType, ck); err != nil {
					return err
				}
			}
			if !found {
				// The failing event was deleted (a prune, while the
				// consumer was disabled): the next event is not it, and
				// never failed. Nothing is poison any more.
				var gone bool
				if err := tx.QueryRow(ctx, skipGoneSQL, *row.failedPosition).Scan(&gone); err != nil {
					return err
				}
				if gone {
					return &opError{msg: fmt.Sprintf("the failing event %d of consumer %s is gone (pruned): nothing to skip; "+
						"restart or enable the consumer to go on with the events after it", *row.failedPosition, label(name, row.instance)),
						kind: ErrNothingToSkip}
				}
			}
		}
		if !found && live {
			// The recorded failure is behind the cursor: not the next
			// event, which never failed.
			return liveSkipRefused(row)
		}
		if !found {
			err := tx.QueryRow(ctx, skipNextSQL, row.cursor.CommitKey, row.cursor.Position, row.eventTypes, row.partIndex, row.partCount).
				Scan(&dl.Position, &ck, &dl.EventType, &dl.TenantID)
			if errors.Is(err, pgx.ErrNoRows) {
				return &opError{msg: fmt.Sprintf("consumer %s has no failing event and no event after its cursor %s to skip "+
					"(an event whose transaction, or an older one, is still open is not visible yet: try again in a moment)", label(name, row.instance), row.cursor), kind: ErrNothingToSkip}
			}
			if err != nil {
				return err
			}
		}
		dl.Error = SkippedByOperator
		if row.lastError != nil && *row.lastError != "" {
			dl.Error += ": " + *row.lastError
		}
		if err := tx.QueryRow(ctx, skipDeadLetterSQL, name, row.instance, dl.Position, dl.EventType, dl.TenantID, dl.Error).
			Scan(&dl.ID, &dl.CreatedAt); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, skipUpdateSQL, name, row.instance, ck, dl.Position)
		return err
	})
	if err != nil {
		return DeadLetter{}, err
	}
	return dl, nil
}

// liveSkipRefused is the refusal of a skip of [SSEConsumerName] that is not
// failing at an event.
func liveSkipRefused(row opRow) error {
	return &opError{msg: fmt.Sprintf("consumer %s feeds the live SSE streams of its process and is not failing at an event: "+
		"a skip would pass over its next event, which those clients would miss without knowing; nothing needs skipping "+
		"(skip it only when it fails at an event, dead or retrying; a client that missed an event resumes from its id by replay)",
		label(row.name, row.instance)), kind: ErrLiveStreamConsumer}
}

// skipRecordedSafe refuses to skip the recorded failing event (of type
// typ, at commit key ck) when the consumer's event types changed since the
// failure was recorded (a new release registered it): an event of a type it
// no longer consumes is not its to skip, and moving the cursor past the
// failing event would pass by the events of its new types that lie before
// it, undelivered and without a dead letter.
func skipRecordedSafe(ctx context.Context, tx pgx.Tx, row opRow, typ string, ck uint64) error {
	failed := *row.failedPosition
	if row.eventTypes != nil && !slices.Contains(row.eventTypes, typ) {
		return &opError{msg: fmt.Sprintf("the failing event %d of consumer %s is of type %s, which the consumer no longer consumes: nothing to skip; "+
			"restart it (enable it if disabled; an idle one goes on by itself) to go on with the events of its types",
			failed, label(row.name, row.instance), typ), kind: ErrNothingToSkip}
	}
	var between bool
	if err := tx.QueryRow(ctx, skipBetweenSQL, row.cursor.CommitKey, row.cursor.Position, ck, failed,
		row.eventTypes, row.partIndex, row.partCount).Scan(&between); err != nil {
		return err
	}
	if between {
		return &opError{msg: fmt.Sprintf("consumer %s has events of its types between its cursor %s and its failing event %d that it was not delivered "+
			"(its event types changed since the failure): a skip would pass them by; restart it (enable it if disabled; an idle one goes on by itself) "+
			"so that they are delivered first, and skip the event if it fails again",
			label(row.name, row.instance), row.cursor, failed), kind: ErrNothingToSkip}
	}
	return nil
}

// RewindTo is the target of [Rewind]. Set Position or Time, not both; the
// zero value rewinds to the start of the log.
type RewindTo struct {
	// Position replays from the event with this position on: the cursor is
	// set just before that event in delivery order (commit key, position),
	// so every event after it in that order is delivered again. Zero means
	// the start of the log.
	Position int64
	// Time replays every event created at or after it: the cursor is set
	// just before the first such event in delivery order. Events created
	// before Time that committed after that event are delivered again too
	// (delivery order is commit order, not creation order).
	Time time.Time
}

// RewindResult is the cursor move of a [Rewind].
type RewindResult struct {
	// From is the cursor before the rewind.
	From eventstore.Cursor
	// To is the cursor after it.
	To eventstore.Cursor
}

const (
	rewindPositionSQL = `SELECT commit_key FROM events WHERE position = $1`
	rewindTimeSQL     = `SELECT commit_key, position FROM events WHERE created_at >= $1
ORDER BY commit_key, position LIMIT 1`
	// rewindBetweenSQL looks for an event the consumer reads (of its types
	// $5 and its partition $6 of $7) between its cursor and the target.
	rewindBetweenSQL = `SELECT EXISTS (SELECT 1 FROM events
  WHERE (commit_key, position) > ($1::xid8, $2::bigint) AND (commit_key, position) <= ($3::xid8, $4::bigint)
    AND ($5::text[] IS NULL OR type = ANY($5))
    AND ($7::int = 1 OR kumiko_stream_partition(stream_id, $7) = $6))`
	rewindUpdateSQL = `UPDATE event_consumers SET cursor_commit_key = $3, cursor_position = $4,
  status = CASE WHEN status = 'dead' THEN 'idle' ELSE status END,
  attempts = 0, failed_position = NULL, last_error = NULL, next_attempt_at = NULL,
  dead_at = NULL, revivals = 0, updated_at = now()
WHERE name = $1 AND instance_id = $2`
)

// Rewind sets the consumer's cursor back so that it delivers events again
// from the target on (see [RewindTo]). It runs under the consumer's lock,
// so it waits for a running pass, and no pass can overwrite the cursor.
// A dead consumer turns idle with its failure record cleared; a disabled
// one stays disabled. A target that no event separates from the cursor
// (the current cursor, or the first event for a consumer at the start)
// leaves the cursor where it is; only events of the consumer's types and
// partition count. An empty instance means [SharedInstance]. It returns
// [ErrEventNotFound] (wrapped) when no event has the position or none was
// created at or after the time; [ErrRewindForward] (wrapped) when the
// target lies after the cursor; [ErrConsumerNotFound] (wrapped) for an
// unknown consumer; an error when both Position and Time are set or
// Position is negative.
func Rewind(ctx context.Context, pool *pgxpool.Pool, name, instance string, to RewindTo) (RewindResult, error) {
	if to.Position != 0 && !to.Time.IsZero() {
		return RewindResult{}, errors.New("dispatcher: rewind: set a position or a time, not both")
	}
	if to.Position < 0 {
		return RewindResult{}, fmt.Errorf("dispatcher: rewind: position %d is negative", to.Position)
	}
	var res RewindResult
	err := withConsumer(ctx, pool, "rewind", name, instance, func(tx pgx.Tx, row opRow) error {
		res.From = row.cursor
		var target eventstore.Cursor
		switch {
		case !to.Time.IsZero():
			err := tx.QueryRow(ctx, rewindTimeSQL, to.Time).Scan(&target.CommitKey, &target.Position)
			if errors.Is(err, pgx.ErrNoRows) {
				return &opError{msg: fmt.Sprintf("no event was created at or after %s", to.Time.Format(time.RFC3339Nano)), kind: ErrEventNotFound}
			}
			if err != nil {
				return err
			}
			target.Position--
		case to.Position > 0:
			err := tx.QueryRow(ctx, rewindPositionSQL, to.Position).Scan(&target.CommitKey)
			if errors.Is(err, pgx.ErrNoRows) {
				return &opError{msg: fmt.Sprintf("no event has position %d", to.Position), kind: ErrEventNotFound}
			}
			if err != nil {
				return err
			}
			target.Position = to.Position - 1
		}
		if row.cursor.Less(target) {
			// Nothing the consumer reads lies between the cursor and the
			// target (e.g. a consumer at the start rewound to the first
			// event, or a partition whose next event lies after the
			// target): the cursor is already there, and stays.
			var between bool
			if err := tx.QueryRow(ctx, rewindBetweenSQL, row.cursor.CommitKey, row.cursor.Position, target.CommitKey, target.Position,
				row.eventTypes, row.partIndex, row.partCount).Scan(&between); err != nil {
				return err
			}
			if !between {
				target = row.cursor
			}
		}
		if row.cursor.Less(target) {
			return &opError{msg: fmt.Sprintf("consumer %s is at cursor %s, before the rewind target %s; rewind only moves back (skip moves past one event)",
				label(name, row.instance), row.cursor, target), kind: ErrRewindForward}
		}
		res.To = target
		_, err := tx.Exec(ctx, rewindUpdateSQL, name, row.instance, target.CommitKey, target.Position)
		return err
	})
	if err != nil {
		return RewindResult{}, err
	}
	return res, nil
}

// RemoveInstanceMinSilence is how long an instance's rows must have gone
// without a heartbeat before [RemoveInstance] removes them (a live process
// beats every HeartbeatInterval, 10s by default).
const RemoveInstanceMinSilence = time.Minute

// RemoveInstance deletes the per-instance state rows of a decommissioned
// process at once, instead of waiting for the dispatchers' automatic
// removal (StaleInstanceAfter, 10 minutes by default), so they neither pin
// retention nor show false lag. It returns how many rows it removed. It
// refuses [SharedInstance] and an empty id with [ErrSharedInstance]
// (wrapped), an instance
// without rows with [ErrConsumerNotFound] (wrapped), and an instance whose
// rows beat within [RemoveInstanceMinSilence] with [ErrInstanceAlive]
// (wrapped); it waits at most [OpsLockTimeout] for the table (an events
// prune holds it until it commits), then fails with [ErrConsumerBusy]
// (wrapped). A process of that instance that is in fact still running puts
// its rows back on its next passes, at the cursors it last committed.
func RemoveInstance(ctx context.Context, pool *pgxpool.Pool, instance string) (int, error) {
	// The message is the CLI's and the admin API's alike (no package prefix,
	// as for the other refusals of the ops verbs).
	switch instance {
	case SharedInstance:
		return 0, &opError{msg: "the shared instance " + SharedInstance + " cannot be removed", kind: ErrSharedInstance}
	case "":
		return 0, &opError{msg: "an instance id is required", kind: ErrSharedInstance}
	}
	var removed int
	timeout := time.Duration(opsLockTimeout.Load())
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// Bounded like the other verbs: an events prune holds the table
		// until it commits, and a caller over HTTP must not hang as long.
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SET LOCAL lock_timeout = %d`, timeout.Milliseconds())); err != nil {
			return err
		}
		var n int
		var age float64
		if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(extract(epoch FROM now() - max(heartbeat_at)), 0)::float8
FROM (SELECT heartbeat_at FROM event_consumers WHERE instance_id = $1 FOR UPDATE) r`, instance).Scan(&n, &age); err != nil {
			return err
		}
		if n == 0 {
			return &opError{msg: fmt.Sprintf("no consumer rows of instance %s", framework.Excerpt(instance)), kind: ErrConsumerNotFound}
		}
		if ageDur := time.Duration(age * float64(time.Second)); ageDur < RemoveInstanceMinSilence {
			return &opError{msg: fmt.Sprintf("instance %s had a heartbeat %s ago; it looks alive (rows are removable after %s of silence)",
				framework.Excerpt(instance), ageDur.Round(time.Second), RemoveInstanceMinSilence), kind: ErrInstanceAlive}
		}
		tag, err := tx.Exec(ctx, `DELETE FROM event_consumers WHERE instance_id = $1`, instance)
		removed = int(tag.RowsAffected())
		return err
	})
	if err != nil {
		var oe *opError
		if errors.As(err, &oe) {
			return 0, err
		}
		if lockTimedOut(err) {
			return 0, &opError{msg: fmt.Sprintf("instance %s: the consumer table stayed locked for %s (an events prune is running?); try again",
				framework.Excerpt(instance), timeout), kind: ErrConsumerBusy}
		}
		return 0, fmt.Errorf("dispatcher: remove instance %s: %w", instance, err)
	}
	return removed, nil
}
