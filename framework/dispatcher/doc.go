// Package dispatcher delivers every committed event to the consumers that
// subscribe to it: multi-stream projections, sagas and the framework's
// system consumers (SSE broadcast, job trigger, cache invalidation).
//
// # Passes
//
// Each consumer has a state row (name, instance_id) in event_consumers; a
// shared consumer uses the instance id [SharedInstance], a per-instance one
// the process's instance id. A pass is one transaction: take a
// transaction-scoped advisory try-lock on (name, instance_id), skip the pass
// if another process holds it; read a batch after the cursor below the
// visibility horizon (eventstore.ReadAfter's rules); run the handlers in this
// transaction, each event scoped to its tenant; advance the cursor; commit.
// A handler's database writes and the cursor commit together, so database
// effects happen once; external effects are at-least-once and belong in jobs.
//
// When event k of a batch fails, the pass is rolled back and re-run up to
// k-1, so the events before it commit with the cursor and the failing one's
// writes are undone; the happy path pays no per-event savepoint. If another
// pass or an ops verb moved the cursor while the lock was free between the
// two transactions, the re-run records nothing: the next pass reads the
// batch afresh, so a failure is never blamed on an event that did not fail.
//
// # Failures
//
// A failing event is retried with exponential backoff; after MaxAttempts the
// consumer turns dead (only that consumer stops). A dead consumer is revived
// automatically after a cooldown, a bounded number of times. A consumer with
// SkipApplyErrors records the event in event_dead_letters and moves on.
// A batch whose handlers outlast [Config.PassTimeout] commits the events
// handled by then; the event whose handler the deadline cut short comes
// first in the next pass, and counts an attempt only if its handler alone
// outlasts the timeout.
//
// # Wake-up
//
// A process wakes its own consumers after its commits ([Dispatcher.Wake]) and
// sends one coalesced NOTIFY on a separate connection; other processes LISTEN
// on a dedicated connection. A jittered poll is the fallback, and the only
// mechanism in poll-only mode (behind a transaction-pooling PgBouncer).
package dispatcher
