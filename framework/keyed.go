package framework

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// KeyedEvent is an event that a write keyed with an idempotency key
// committed (see [Runtime.KeyedEvents]).
type KeyedEvent struct {
	// Position is the event's position, its public id.
	Position int64 `json:"position"`
	// Type is the qualified event type.
	Type string `json:"type"`
	// Stream is the event's aggregate stream.
	Stream KeyedStream `json:"stream"`
	// Version is the event's version within its stream.
	Version int64 `json:"version"`
}

// KeyedStream names a [KeyedEvent]'s stream.
type KeyedStream struct {
	// Type is the aggregate type.
	Type string `json:"type"`
	// ID is the aggregate's id.
	ID string `json:"id"`
}

// maxKeyedEvents caps what [Runtime.KeyedEvents] returns.
const maxKeyedEvents = 100

// keyedEventsSQL finds the events a keyed write of a user committed in the
// tenant (row-level security confines it too) since a time; the created_at
// index bounds the scan.
const keyedEventsSQL = `SELECT position, type, stream_type, stream_id, version FROM events
WHERE created_at >= now() - $4::interval AND tenant_id = $1
  AND metadata->>'idempotencyKey' = $3 AND metadata->>'userId' = $2
ORDER BY position LIMIT $5`

// keyedLockSQL waits for and takes the lock of keyedLockKey in the
// transaction (its two keys from tenancy.LockIDs, as the write takes it).
const keyedLockSQL = `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`

// keyedLockKey is the key of the transaction advisory lock that every
// writing transaction carrying an idempotency key holds from its first
// statement to its end (taken with BEGIN), and that [Runtime.KeyedEvents]
// waits for: the unit separators keep tenant, user and key apart.
func keyedLockKey(tenant, user, key string) string {
	return "kumiko-idempotency\x1f" + tenant + "\x1f" + user + "\x1f" + key
}

// KeyedEvents returns the events (at most 100, oldest first) that writes of
// p carrying the idempotency key (see [Call].IdempotencyKey) committed
// within the last window. The idempotency middleware asks it before it
// runs a keyed write whose previous owner died: a write that committed
// must not run again. It reads on the primary in p's tenant scope, after
// waiting until no transaction of such a write is still open (a dead
// owner's backend can outlive its process, holding a pipelined COMMIT
// behind a statement that waits for a lock); a database failure, or ctx
// ending while it waits, is a CodeUnavailable *[Error].
func (rt *Runtime) KeyedEvents(ctx context.Context, p Principal, key string, window time.Duration) ([]KeyedEvent, error) {
	conn, err := rt.pool.Acquire(ctx)
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: err}
	}
	defer conn.Release()
	var out []KeyedEvent
	_, err = rt.runOn(ctx, conn, p.TenantID, p, Metadata{UserID: p.UserID}, true, nil, keyedGuard{}, func(ctx context.Context, tx *Tx) error {
		// Wait for a keyed write of the dead owner that may still be
		// under way in the database (its process is gone, its backend
		// not yet: a statement waiting for a lock, with the COMMIT
		// pipelined behind it), so that the query below, whose snapshot
		// is taken after the wait, sees what it committed.
		k1, k2 := tenancy.LockIDs(keyedLockKey(p.TenantID, p.UserID, key))
		if _, err := tx.Exec(ctx, keyedLockSQL, k1, k2); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, keyedEventsSQL, p.TenantID, p.UserID, key, window, maxKeyedEvents)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeyedEvent, error) {
			var e KeyedEvent
			err := r.Scan(&e.Position, &e.Type, &e.Stream.Type, &e.Stream.ID, &e.Version)
			return e, err
		})
		return err
	})
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: fmt.Errorf("keyed events: %w", err)}
	}
	return out, nil
}

// keyedGuardSQL fails (invalid_text_representation, with the message
// keyedGuardMessage) when events with the key of another owner of the user
// were committed since $5: this owner's claim was taken over, and the
// newer owner ran the write, or this owner took the key over and its
// previous owner, still running, committed the write after all (see
// keyedGuard). It runs in the write's transaction, after the key's
// advisory lock (taken with BEGIN), so that it sees what such an owner
// committed before; one that takes the key over later waits for this
// transaction in its KeyedEvents. The bound keeps the index scan of a
// healthy claim empty (it lies in the future).
const keyedGuardSQL = `SELECT CASE WHEN n > 0 THEN ('` + keyedGuardMessage + `' || n)::int END FROM (
  SELECT count(*) AS n FROM (SELECT 1 FROM events
    WHERE created_at >= $5 AND tenant_id = $1 AND metadata->>'idempotencyKey' = $3
      AND metadata->>'userId' = $2 AND metadata->>'idempotencyOwner' IS DISTINCT FROM $4 LIMIT 1) e) s`

// keyedGuardMessage starts the value keyedGuardSQL fails to cast.
const keyedGuardMessage = "kumiko: idempotency key taken over, events of another owner: "

// queueKeyedGuard queues keyedGuardSQL in b; *takenOver is set when it
// fails for its reason.
func queueKeyedGuard(b *pgx.Batch, tenant string, meta Metadata, since time.Time, takenOver *bool) {
	b.Queue(keyedGuardSQL, tenant, meta.UserID, meta.IdempotencyKey, meta.IdempotencyOwner, since).QueryRow(func(r pgx.Row) error {
		var v *int32
		err := r.Scan(&v)
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "22P02" && strings.Contains(pgErr.Message, keyedGuardMessage) {
			*takenOver = true
		}
		return err
	})
}

// keyedGuard says when a keyed write checks before its COMMIT for events
// of another owner with its key (keyedGuardSQL).
type keyedGuard struct {
	// leaseUntil is [Call].IdempotencyLeaseUntil.
	leaseUntil time.Time
	// reclaimedSince is [Call].IdempotencyReclaimedSince.
	reclaimedSince time.Time
}

func (c Call) keyedGuard() keyedGuard {
	return keyedGuard{leaseUntil: c.IdempotencyLeaseUntil, reclaimedSince: c.IdempotencyReclaimedSince}
}

// since reports whether the write of meta checks at now, and since when.
// A write that took its key over always checks, since the key's first
// claim: the previous owner may have begun its transaction only after this
// owner's look for its events (which waits for the advisory lock of an
// open one, not for one still to come) and committed since. Otherwise only
// a claim whose lease may have ended by now can have been taken over before
// this transaction's advisory lock (taken earlier, with BEGIN); one taken
// over later waits for the lock and sees this write's events. So a fresh
// claim's write that ends within its lease, nearly all of them, queues no
// guard.
func (g keyedGuard) since(meta Metadata, now time.Time) (time.Time, bool) {
	switch {
	case meta.IdempotencyReclaimedFrom != "":
		return g.reclaimedSince, true
	case !g.leaseUntil.IsZero() && !now.Before(g.leaseUntil):
		return g.leaseUntil, true
	}
	return time.Time{}, false
}

// errKeyTakenOver is the error of a keyed write that keyedGuardSQL stopped.
func errKeyTakenOver(meta Metadata) error {
	msg := "this request's claim of its idempotency key ran out while it ran, and another request with the key " +
		"took it over and committed the write; nothing of this request was committed"
	if meta.IdempotencyReclaimedFrom != "" {
		msg = "this request took its idempotency key over from an owner whose claim had run out, and that owner " +
			"(or another request with the key) committed the write while this request ran; nothing of this request was committed"
	}
	return &Error{Code: CodeConflict, Message: msg,
		Details: map[string]any{"idempotencyKey": meta.IdempotencyKey, "committed": true}}
}
