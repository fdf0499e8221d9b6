package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// layout is a declared consumer's partitioning: the state rows it needs.
type layout struct {
	base       string
	instance   string
	partitions int
}

// names returns the state-row names of l.
func (l layout) names() []string {
	if l.partitions <= 1 {
		return []string{l.base}
	}
	out := make([]string, l.partitions)
	for i := range out {
		out[i] = PartitionName(l.base, i)
	}
	return out
}

// fits reports whether a stored row belongs to l as it is declared now.
func (l layout) fits(r storedRow) bool {
	if l.partitions <= 1 {
		return r.name == l.base && r.count == 1
	}
	return r.count == l.partitions && r.name == PartitionName(l.base, r.index)
}

// storedRow is a state row of a declared consumer, in any partitioning.
type storedRow struct {
	name      string
	index     int
	count     int
	status    string
	cursor    eventstore.Cursor
	processed int64
}

// LayoutError is a [Dispatcher.Register] refusal: a consumer's stored
// state rows are partitioned otherwise than it is declared now, and their
// cursors do not line up, so no set of new cursors would deliver every
// event exactly once.
type LayoutError struct {
	// Consumer is the declared name; Instance the state rows' instance id.
	Consumer, Instance string
	// Stored and Declared are the partition counts.
	Stored, Declared int
	// Behind names the stored rows with events left to deliver before the
	// furthest stored cursor.
	Behind []string
	// Stopped names those of Behind that are disabled or dead: they do not
	// catch up until an operator enables or restarts them.
	Stopped []string
}

// Error says what differs and the ways out.
func (e *LayoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "consumer %s: its state rows have %d partition(s), the code declares %d, "+
		"and %s still have events to deliver before the furthest cursor among them; ",
		label(e.Consumer, e.Instance), e.Stored, e.Declared, strings.Join(e.Behind, ", "))
	if e.Instance == SharedInstance || e.Instance == "" {
		// Rebuild takes shared projections only (and refuses the others).
		fmt.Fprintf(&b, "a projection with a table can be rebuilt (kumiko projection rebuild %s), which starts every new "+
			"partition at the rebuild's cursor; otherwise ", e.Consumer)
	}
	fmt.Fprintf(&b, "run the code with %d partition(s) until those have caught up", e.Stored)
	if len(e.Stopped) > 0 {
		fmt.Fprintf(&b, " (%s disabled or dead: enable or restart them with kumiko consumer so that they catch up)",
			strings.Join(e.Stopped, ", "))
	}
	return b.String()
}

// ErrLayout matches every *LayoutError with errors.Is.
var ErrLayout = errors.New("dispatcher: consumer partitioning changed")

// Is makes errors.Is(err, ErrLayout) true.
func (e *LayoutError) Is(target error) bool { return target == ErrLayout }

const (
	// layoutRowsSQL reads the stored state rows of declared consumers ($1
	// bases, $2 their instance ids) in any partitioning: the row named like
	// the consumer and the rows named like its partitions.
	layoutRowsSQL = `SELECT b.base, c.name, c.partition_index, c.partition_count, c.status,
  c.cursor_commit_key, c.cursor_position, c.events_processed
FROM unnest($1::text[], $2::text[]) AS b(base, inst)
JOIN event_consumers c ON c.instance_id = b.inst
  AND (c.name = b.base OR (starts_with(c.name, b.base || '@') AND substr(c.name, length(b.base) + 2) ~ '^[0-9]+$'))
ORDER BY b.base, c.name`
	// layoutLockSQL serialises the registrations of one consumer, so two
	// processes never convert its rows at once.
	layoutLockSQL = `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`
	// behindSQL names the rows ($1, of instance $2) with an event of their
	// own types and partition after their cursor and up to ($3, $4), and
	// whether each is stopped (disabled or dead).
	behindSQL = `SELECT c.name, c.status IN ('disabled', 'dead') FROM event_consumers c
WHERE c.name = ANY($1) AND c.instance_id = $2 AND EXISTS (
  SELECT 1 FROM events e
  WHERE (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
    AND (e.commit_key, e.position) <= ($3::xid8, $4::bigint)
    AND (c.event_types IS NULL OR e.type = ANY(c.event_types))
    AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index))
ORDER BY c.name`
	// convertDeadLettersSQL gives the dead letters of the replaced rows
	// ($2, of instance $4) to the new row of the event's stream among $3
	// partitions of $1 (the first one when the event is gone), as a
	// rebuild's swap does: the replaced rows' names no longer exist.
	convertDeadLettersSQL = `UPDATE event_dead_letters dl SET consumer = CASE WHEN $3::int <= 1 THEN $1
  ELSE $1 || '@' || coalesce((SELECT kumiko_stream_partition(e.stream_id, $3) FROM events e WHERE e.position = dl.position), 0)::text END
WHERE dl.consumer = ANY($2) AND dl.instance_id = $4`
	convertInsertSQL = `INSERT INTO event_consumers (name, instance_id, event_types, cursor_commit_key, cursor_position,
  status, events_processed, partition_index, partition_count)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
)

// LayoutLockKey is the key of the transaction advisory lock (hashed with
// hashtextextended) that serialises changes to the set of state rows of
// the consumer declared as name: [Dispatcher.Register] holds it while it
// converts them, a rebuild's swap while it replaces them. Take it before
// any pass lock ([LockKey]) of the consumer's rows.
func LayoutLockKey(name, instance string) string { return LockKey(name+"@layout", instance) }

// lineUp converts, in tx, the stored state rows of every declared consumer
// whose partitioning changed, after taking each consumer's registration
// lock. The stored rows must line up: with C the furthest of their
// cursors, none may have an event of its types and partition left before
// C. Then every stored row has delivered exactly the events up to C of its
// share of the log, and the new rows start at C: every event is delivered
// exactly once. Unpartitioned rows (one cursor) always line up. Rows that
// do not line up are refused with a *LayoutError.
func (d *Dispatcher) lineUp(ctx context.Context, tx pgx.Tx) error {
	declared := make([]layout, 0, len(d.bases))
	for _, l := range d.bases {
		declared = append(declared, l)
	}
	// The reserved consumers' locks too, in one sorted order with the
	// others (two processes taking them in different orders could
	// deadlock): their rows are created in this transaction.
	keys := make([]string, 0, len(declared)+len(d.reserved))
	for _, l := range declared {
		keys = append(keys, LayoutLockKey(l.base, l.instance))
	}
	for _, r := range d.reserved {
		keys = append(keys, LayoutLockKey(r.base, SharedInstance))
	}
	slices.Sort(keys)
	bases, insts := make([]string, len(declared)), make([]string, len(declared))
	b := &pgx.Batch{}
	for i, l := range declared {
		bases[i], insts[i] = l.base, l.instance
	}
	for _, k := range keys {
		b.Queue(layoutLockSQL, k)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("lock consumer registration: %w", err)
	}
	stored, err := readLayoutRows(ctx, tx, bases, insts, false)
	if err != nil {
		return err
	}
	for _, l := range declared {
		rows := stored[l.base]
		if !slices.ContainsFunc(rows, func(r storedRow) bool { return !l.fits(r) }) {
			continue
		}
		if err := d.convert(ctx, tx, l, rows); err != nil {
			return err
		}
	}
	return nil
}

// convert replaces the stored rows of l (a partitioning that is not l's)
// with l's rows at the furthest stored cursor, if they line up.
func (d *Dispatcher) convert(ctx context.Context, tx pgx.Tx, l layout, rows []storedRow) error {
	// Wait out the passes in flight of the stored rows (a process of the
	// previous code may still run them) and keep new ones out: a pass takes
	// its lock with a try-lock and skips.
	old := make([]string, len(rows))
	for i, r := range rows {
		old[i] = r.name
	}
	slices.Sort(old)
	b := &pgx.Batch{}
	for _, name := range old {
		b.Queue(layoutLockSQL, LockKey(name, l.instance))
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("consumer %s: lock stored partitions: %w", l.base, err)
	}
	// The cursors as the passes left them.
	fresh, err := readLayoutRows(ctx, tx, []string{l.base}, []string{l.instance}, true)
	if err != nil {
		return err
	}
	rows = fresh[l.base]
	if !slices.ContainsFunc(rows, func(r storedRow) bool { return !l.fits(r) }) {
		return nil // replaced meanwhile with l's rows
	}
	for _, r := range rows {
		if _, held := slices.BinarySearch(old, r.name); !held {
			// Created meanwhile by a process that does not take the
			// registration lock (a release before partitions registering
			// its row): its passes are not held here, one may be in flight
			// and would commit against the converted rows. The next
			// attempt locks them.
			return fmt.Errorf("consumer %s: state row %s appeared while registration waited for the stored rows' passes; try again",
				label(l.base, l.instance), r.name)
		}
	}
	furthest := rows[0].cursor
	// A partition an operator disabled keeps the consumer paused: every
	// new row starts disabled (enable them when ready).
	disabled := false
	var processed int64
	old = old[:0]
	for _, r := range rows {
		if furthest.Less(r.cursor) {
			furthest = r.cursor
		}
		disabled = disabled || r.status == "disabled"
		processed += r.processed
		old = append(old, r.name)
	}
	brows, err := tx.Query(ctx, behindSQL, old, l.instance, furthest.CommitKey, furthest.Position)
	if err != nil {
		return fmt.Errorf("consumer %s: compare stored cursors: %w", l.base, err)
	}
	var behind, stopped []string
	var (
		name    string
		stopRow bool
	)
	if _, err := pgx.ForEachRow(brows, []any{&name, &stopRow}, func() error {
		behind = append(behind, name)
		if stopRow {
			stopped = append(stopped, name)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("consumer %s: compare stored cursors: %w", l.base, err)
	}
	if len(behind) > 0 {
		return &LayoutError{Consumer: l.base, Instance: l.instance, Stored: rows[0].count, Declared: l.partitions,
			Behind: behind, Stopped: stopped}
	}
	cons := d.byName[l.names()[0]]
	status := "idle"
	if disabled {
		status = "disabled"
	}
	b = &pgx.Batch{}
	b.Queue(`DELETE FROM event_consumers WHERE name = ANY($1) AND instance_id = $2`, old, l.instance)
	for i, name := range l.names() {
		n := int64(0)
		if i == 0 {
			n = processed
		}
		b.Queue(convertInsertSQL, name, l.instance, cons.EventTypes, furthest.CommitKey, furthest.Position,
			status, n, i, l.partitions)
	}
	b.Queue(convertDeadLettersSQL, l.base, old, l.partitions, l.instance)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("consumer %s: convert partitions: %w", l.base, err)
	}
	d.log.Info("consumer partitions changed", "consumer", l.base, "instance_id", l.instance,
		"from", strconv.Itoa(rows[0].count), "to", strconv.Itoa(l.partitions), "cursor", furthest.String(), "status", status)
	return nil
}

// readLayoutRows returns the stored rows of the bases, by base.
// With lock it locks them for update: only after their pass locks, or a
// pass in flight would wait for the row while this waits for the pass.
func readLayoutRows(ctx context.Context, tx pgx.Tx, bases, insts []string, lock bool) (map[string][]storedRow, error) {
	q := layoutRowsSQL
	if lock {
		q += "\nFOR UPDATE OF c"
	}
	rows, err := tx.Query(ctx, q, bases, insts)
	if err != nil {
		return nil, fmt.Errorf("read consumer state rows: %w", err)
	}
	defer rows.Close()
	out := map[string][]storedRow{}
	for rows.Next() {
		var base string
		var r storedRow
		if err := rows.Scan(&base, &r.name, &r.index, &r.count, &r.status, &r.cursor.CommitKey, &r.cursor.Position, &r.processed); err != nil {
			return nil, fmt.Errorf("read consumer state rows: %w", err)
		}
		out[base] = append(out[base], r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read consumer state rows: %w", err)
	}
	return out, nil
}

// StoredRows returns the names and statuses of the state rows stored for
// the consumer declared as name (its own row and its partitions' rows, in
// whatever partitioning they were stored). With lock it locks them for
// update in tx: only while holding their pass locks ([LockKey]), or a pass
// in flight deadlocks with tx. A rebuild replaces them with the rows of the
// partitioning declared now.
func StoredRows(ctx context.Context, tx pgx.Tx, name, instance string, lock bool) (names, statuses []string, err error) {
	stored, err := readLayoutRows(ctx, tx, []string{name}, []string{instance}, lock)
	if err != nil {
		return nil, nil, err
	}
	for _, r := range stored[name] {
		names, statuses = append(names, r.name), append(statuses, r.status)
	}
	return names, statuses, nil
}

// RowNames returns the state-row names of a consumer declared as name with
// partitions partitions (name itself for 0 or 1).
func RowNames(name string, partitions int) []string {
	return layout{base: name, partitions: partitions}.names()
}
