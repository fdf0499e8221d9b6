package retention

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// Options select what [Prune] deletes.
type Options struct {
	// OlderThanDays selects events created more than this many days ago.
	// Required; at least 1.
	OlderThanDays int
	// Types are the qualified event types to prune. Every name must be
	// declared in the registry, or be the type of events in the log (a type
	// the code no longer declares); aggregate types may be named (an
	// explicit choice). Defaults to every pub/sub type of the registry.
	Types []string
	// DryRun counts what would be deleted, runs the lag guard, and deletes
	// nothing. Defaults to false.
	DryRun bool
}

// Result reports what [Prune] deleted (or, in a dry run, would delete).
type Result struct {
	// Types are the selected event types, sorted; empty when the registry
	// declares no pub/sub type and none was named (nothing to do).
	Types []string
	// Cutoff is the creation time before which events were selected.
	Cutoff time.Time
	// Counts holds the number of events per selected type (0 included).
	Counts map[string]int64
	// Total is the sum of Counts.
	Total int64
	// DryRun is set when nothing was deleted on purpose.
	DryRun bool
}

// LaggingConsumer is a consumer that has not passed every event a prune
// selected.
type LaggingConsumer struct {
	// Name is the consumer's name.
	Name string
	// InstanceID is the state row's instance id ("__shared__" for shared
	// consumers).
	InstanceID string
	// Status is idle, dead or [StatusUnregistered].
	Status string
	// Cursor is the consumer's cursor.
	Cursor eventstore.Cursor
	// Unseen counts the selected events after the cursor that the consumer
	// reads (capped at one million).
	Unseen int64
}

// StatusUnregistered is the Status of a consumer the registry declares
// that has no state row yet: no process of this build has started and
// registered it. It counts as sitting at the start of the log, where that
// process will register it.
const StatusUnregistered = "unregistered"

// LagError is returned when a prune is refused because consumers have not
// passed the events it would delete.
type LagError struct {
	// Consumers are the lagging consumers, sorted by name and instance.
	Consumers []LaggingConsumer
}

// Error names the lagging consumers and the ways out.
func (e *LagError) Error() string {
	var b strings.Builder
	b.WriteString("retention: refused: consumers have not passed the events to prune:")
	var plain, unregistered bool
	for _, c := range e.Consumers {
		if c.Status == StatusUnregistered {
			fmt.Fprintf(&b, "\n  %s (not registered yet, starts at the start of the log): %d unseen", c.Name, c.Unseen)
			unregistered = true
			continue
		}
		fmt.Fprintf(&b, "\n  %s (instance %s, %s, cursor %s): %d unseen", c.Name, c.InstanceID, c.Status, c.Cursor, c.Unseen)
		if _, ok := strings.CutSuffix(c.Name, rebuildSuffix); !ok {
			plain = true
		}
	}
	if unregistered {
		// No row: the consumer verbs have nothing to move on yet.
		b.WriteString("\nconsumers not registered yet are declared by this build but no process of it has run them: " +
			"start the release's workers or all-in-one processes (any of its processes, for a shared projection with runIn api), which register them at the start of the log, then prune again")
	}
	for _, c := range e.Consumers {
		// Skipping or rewinding a rebuild's temporary consumer would drop
		// or repeat events in the table it builds.
		if name, ok := strings.CutSuffix(c.Name, rebuildSuffix); ok {
			fmt.Fprintf(&b, "\n%s is a projection rebuild's: let it finish, or remove what a killed one left with `kumiko projection rebuild %s --abandon`", c.Name, name)
		}
	}
	if plain {
		b.WriteString("\nlet them catch up, or move them on with `kumiko consumer skip NAME [--instance ID]` or `kumiko consumer disable NAME [--instance ID]`, then prune again")
	}
	return b.String()
}

// rebuildSuffix ends the name of a projection rebuild's temporary consumer
// (rebuild.ConsumerName; that package builds on this one's neighbours and
// is not imported here).
const rebuildSuffix = "#rebuild"

// MaxOlderThanDays bounds Options.OlderThanDays: more days than that
// (about 2,700 years) reach before the earliest time Postgres can hold.
const MaxOlderThanDays = 1_000_000

var (
	// ErrUnknownType is returned when Options.Types names an event type the
	// registry does not declare.
	ErrUnknownType = errors.New("retention: unknown event type")
	// ErrPruneRunning is returned when another prune holds the prune lock.
	ErrPruneRunning = errors.New("retention: another prune is running")
	// ErrBadAge is returned when Options.OlderThanDays is below 1 or above
	// MaxOlderThanDays.
	ErrBadAge = fmt.Errorf("retention: older-than-days must be between 1 and %d", MaxOlderThanDays)
)

// SelectTypes returns the types a prune of names deletes, sorted: the
// named ones (each must be declared in reg, else the error wraps
// [ErrUnknownType] and repeats an [framework.Excerpt] of the unknown ones) or, when names is empty, every pub/sub type of reg.
func SelectTypes(reg *framework.Registry, names []string) ([]string, error) {
	if len(names) == 0 {
		var out []string
		for _, t := range reg.EventTypes() {
			if reg.IsPubSub(t) {
				out = append(out, t)
			}
		}
		return out, nil
	}
	var unknown []string
	out := make([]string, 0, len(names))
	for _, n := range names {
		if !reg.HasEvent(n) {
			unknown = append(unknown, n)
			continue
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w: %s (declared: %s)", ErrUnknownType, framework.Excerpt(strings.Join(unknown, ", ")), strings.Join(reg.EventTypes(), ", "))
	}
	slices.Sort(out)
	return out, nil
}

// inLogSQL returns those of the names $1 that events in the log have.
const inLogSQL = `SELECT t FROM unnest($1::text[]) AS t WHERE EXISTS (SELECT 1 FROM events e WHERE e.type = t)`

// selectTypes is [SelectTypes], except that a named type the registry no
// longer declares is accepted while events of it are in the log: the
// events of a removed or renamed feature could otherwise never be pruned.
// A name that is neither (a typo) still wraps [ErrUnknownType].
func selectTypes(ctx context.Context, pool *pgxpool.Pool, reg *framework.Registry, names []string) ([]string, error) {
	var declared, undeclared []string
	for _, n := range names {
		if reg.HasEvent(n) {
			declared = append(declared, n)
		} else if !slices.Contains(undeclared, n) {
			undeclared = append(undeclared, n)
		}
	}
	if len(undeclared) == 0 {
		return SelectTypes(reg, names)
	}
	// Named types only (no SelectTypes of none: that is every pub/sub type).
	out := slices.Clone(declared)
	rows, err := pool.Query(ctx, inLogSQL, undeclared)
	if err != nil {
		return nil, fmt.Errorf("retention: look up types in the log: %w", err)
	}
	inLog, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("retention: look up types in the log: %w", err)
	}
	var unknown []string
	for _, n := range undeclared {
		if !slices.Contains(inLog, n) {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w: %s (declared: %s; no event of such a type is in the log either)",
			ErrUnknownType, framework.Excerpt(strings.Join(unknown, ", ")), strings.Join(reg.EventTypes(), ", "))
	}
	out = append(out, inLog...)
	slices.Sort(out)
	return slices.Compact(out), nil
}

const (
	// pruneLockSQL serialises prunes (two concurrent REPEATABLE READ
	// deletes of the same rows would fail with a serialization error).
	pruneLockSQL   = `SELECT pg_try_advisory_lock(hashtextextended('kumiko-events-prune', 0))`
	pruneUnlockSQL = `SELECT pg_advisory_unlock(hashtextextended('kumiko-events-prune', 0))`
	// lockConsumersSQL runs before the transaction's first query, so the
	// snapshot is taken after it: every consumer change that committed
	// before the lock is seen, and none can happen until commit.
	lockConsumersSQL = `LOCK TABLE event_consumers IN SHARE MODE`
	cutoffSQL        = `SELECT now() - make_interval(days => $1)`
	// guardSQL lists the consumers (not disabled, reading one of the types)
	// with a candidate event after their cursor. $3 are the shared
	// consumers this build declares ([declaredConsumers]: name, types): a
	// row of one (its partitions' too) reads the declared types besides
	// its own (the row lists the types of the last process that started,
	// which may be an older release's), and one without any row counts as
	// sitting at the start of the log, where the first process of this
	// build will register it (status unregistered).
	guardSQL = `WITH decl AS (
  SELECT d->>'name' AS name, ARRAY(SELECT jsonb_array_elements_text(d->'types')) AS types
  FROM jsonb_array_elements($3::jsonb) d
), cons AS (
  SELECT c.name, c.instance_id, c.status, c.cursor_commit_key, c.cursor_position, c.partition_index, c.partition_count,
    CASE WHEN c.event_types IS NULL THEN NULL
      ELSE c.event_types || coalesce((SELECT d.types FROM decl d
        WHERE c.instance_id = '__shared__' AND d.name = regexp_replace(c.name, '@[0-9]+$', '')), '{}') END AS event_types
  FROM event_consumers c
  UNION ALL
  SELECT d.name, '__shared__', 'unregistered', '0'::xid8, 0, 0, 1, d.types
  FROM decl d WHERE NOT EXISTS (SELECT 1 FROM event_consumers c
    WHERE c.instance_id = '__shared__' AND regexp_replace(c.name, '@[0-9]+$', '') = d.name)
)
SELECT name, instance_id, status, cursor_commit_key, cursor_position, unseen FROM (
  SELECT c.name, c.instance_id, c.status, c.cursor_commit_key, c.cursor_position,
    (SELECT count(*) FROM (SELECT 1 FROM events e
       WHERE e.type = ANY($1) AND e.created_at < $2
         AND (c.event_types IS NULL OR e.type = ANY(c.event_types))
         AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index)
         AND (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
       LIMIT 1000000) x) AS unseen
  FROM cons c
  WHERE c.status <> 'disabled' AND (c.event_types IS NULL OR c.event_types && $1)
) g WHERE unseen > 0 ORDER BY name, instance_id`
	countSQL = `SELECT type, count(*) FROM events WHERE type = ANY($1) AND created_at < $2 GROUP BY type`
	// deleteSQL deletes and records, per tenant, stream type and type, the
	// last deleted event in delivery order in event_prune_marks, so that a
	// reader resuming from an older cursor learns that it would miss events.
	deleteSQL = `WITH d AS (DELETE FROM events WHERE type = ANY($1) AND created_at < $2
  RETURNING tenant_id, stream_type, type, commit_key, position),
m AS (INSERT INTO event_prune_marks AS p (tenant_id, stream_type, type, commit_key, position)
  SELECT DISTINCT ON (tenant_id, stream_type, type) tenant_id, stream_type, type, commit_key, position FROM d
  ORDER BY tenant_id, stream_type, type, commit_key DESC, position DESC
  ON CONFLICT (tenant_id, stream_type, type) DO UPDATE
  SET commit_key = EXCLUDED.commit_key, position = EXCLUDED.position, pruned_at = now()
  WHERE (EXCLUDED.commit_key, EXCLUDED.position) > (p.commit_key, p.position))
SELECT type, count(*) FROM d GROUP BY type`
)

// Prune deletes events of the selected types created more than
// opts.OlderThanDays days ago, in one transaction that holds the consumer
// table in SHARE mode, unless a consumer that is not disabled has not passed
// them: then it deletes nothing and returns a *[LagError]. The consumers
// are the state rows and the shared consumers reg declares that have no row
// yet (at the start of the log, where their first process registers them:
// [StatusUnregistered]); a declared consumer's rows count with reg's event
// types besides their own. In a dry run it
// counts instead of deleting; when the guard refuses, it returns the counts
// together with the *LagError. A delete records, per tenant, stream type and
// type, the last deleted event in event_prune_marks, so that an SSE client
// resuming from before it is refused instead of missing events silently.
//
// It returns [ErrBadAge] for OlderThanDays out of range, an error wrapping
// [ErrUnknownType] for a type name neither declared nor in the log, and [ErrPruneRunning] when
// another prune is running. With no type named and no pub/sub type
// declared, it does nothing and returns a Result with no Types.
func Prune(ctx context.Context, pool *pgxpool.Pool, reg *framework.Registry, opts *Options) (*Result, error) {
	if opts == nil {
		opts = &Options{}
	}
	if opts.OlderThanDays < 1 || opts.OlderThanDays > MaxOlderThanDays {
		return nil, ErrBadAge
	}
	types, err := selectTypes(ctx, pool, reg, opts.Types)
	if err != nil {
		return nil, err
	}
	res := &Result{Types: types, Counts: map[string]int64{}, DryRun: opts.DryRun}
	if len(types) == 0 {
		return res, nil
	}
	for _, t := range types {
		res.Counts[t] = 0
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("retention: acquire: %w", err)
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, pruneLockSQL).Scan(&locked); err != nil {
		return nil, fmt.Errorf("retention: prune lock: %w", err)
	}
	if !locked {
		return nil, ErrPruneRunning
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, pruneUnlockSQL); err != nil {
			// A connection that cannot unlock must not go back to the pool
			// holding the lock.
			_ = conn.Conn().Close(uctx)
		}
	}()
	lagErr, err := prune(ctx, conn.Conn(), types, declaredConsumers(reg), opts, res)
	if err != nil {
		return nil, fmt.Errorf("retention: %w", err)
	}
	if lagErr != nil {
		if opts.DryRun {
			return res, lagErr
		}
		return nil, lagErr
	}
	return res, nil
}

// prune runs the prune transaction on conn, filling res.
func prune(ctx context.Context, conn *pgx.Conn, types []string, declared []declaredConsumer, opts *Options, res *Result) (*LagError, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, lockConsumersSQL); err != nil {
		return nil, fmt.Errorf("lock consumers: %w", err)
	}
	if err := tx.QueryRow(ctx, cutoffSQL, opts.OlderThanDays).Scan(&res.Cutoff); err != nil {
		return nil, fmt.Errorf("cutoff: %w", err)
	}
	rows, err := tx.Query(ctx, guardSQL, types, res.Cutoff, declared)
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	lagging, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LaggingConsumer, error) {
		var c LaggingConsumer
		err := r.Scan(&c.Name, &c.InstanceID, &c.Status, &c.Cursor.CommitKey, &c.Cursor.Position, &c.Unseen)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	var lagErr *LagError
	if len(lagging) > 0 {
		lagErr = &LagError{Consumers: lagging}
	}
	switch {
	case opts.DryRun:
		err = collectCounts(ctx, tx, countSQL, types, res)
	case lagErr != nil:
		return lagErr, nil
	default:
		err = collectCounts(ctx, tx, deleteSQL, types, res)
	}
	if err != nil {
		return nil, err
	}
	if opts.DryRun {
		return lagErr, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return nil, nil
}

// declaredConsumer is a shared consumer the registry declares, as the
// guard reads it (JSON).
type declaredConsumer struct {
	Name  string   `json:"name"`
	Types []string `json:"types"`
}

// declaredConsumers returns the shared consumers a process built on reg
// registers at the start of the log: its shared multi-stream projections
// (sagas included) and, with jobs, the job-trigger consumer. Left out:
// per-instance consumers (the instances to come are unknown; the SSE
// broadcast starts at the head anyway) and the cache-invalidation consumer
// (a cache entry is filled after the events it would replay, so they
// invalidate nothing).
func declaredConsumers(reg *framework.Registry) []declaredConsumer {
	out := []declaredConsumer{} // JSON [] for none, not null
	for _, p := range reg.Projections() {
		o := p.Options()
		if p.Kind() != framework.KindMultiStream || o.Delivery == framework.DeliveryPerInstance {
			continue
		}
		if types := p.EventTypes(); len(types) > 0 {
			out = append(out, declaredConsumer{Name: p.Name(), Types: types})
		}
	}
	if set := jobs.For(reg); set.Len() > 0 {
		if types := set.TriggerTypes(); len(types) > 0 {
			out = append(out, declaredConsumer{Name: jobs.ConsumerName, Types: types})
		}
	}
	return out
}

const pruneDeadLettersSQL = `DELETE FROM event_dead_letters WHERE created_at < now() - make_interval(days => $1)`

// PruneDeadLetters deletes the dead letters (event_dead_letters: the events
// consumers moved past without delivering them, by SkipApplyErrors or an
// operator's skip) recorded more than olderThanDays days ago, of every
// consumer and instance, and returns how many it deleted. Nothing else
// removes them, also not those of consumers or instances that are gone.
// The events themselves stay in the log (until [Prune] deletes them). It
// returns [ErrBadAge] for olderThanDays out of range.
func PruneDeadLetters(ctx context.Context, pool *pgxpool.Pool, olderThanDays int) (int64, error) {
	if olderThanDays < 1 || olderThanDays > MaxOlderThanDays {
		return 0, ErrBadAge
	}
	tag, err := pool.Exec(ctx, pruneDeadLettersSQL, olderThanDays)
	if err != nil {
		return 0, fmt.Errorf("retention: prune dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}

// collectCounts runs a (type, count) query into res.
func collectCounts(ctx context.Context, tx pgx.Tx, sql string, types []string, res *Result) error {
	rows, err := tx.Query(ctx, sql, types, res.Cutoff)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ string
		var n int64
		if err := rows.Scan(&typ, &n); err != nil {
			return fmt.Errorf("delete: %w", err)
		}
		res.Counts[typ] = n
		res.Total += n
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}
