// Package rebuild replays a multi-stream projection that owns a table from
// the start of the event log into a fresh table and swaps it in, while the
// application keeps writing: `kumiko projection rebuild NAME`.
//
// # Blue/green
//
// [Rebuild] works in three steps:
//
//  1. It creates a shadow schema (kumiko_rebuild_<hash>_<name>, see
//     [ShadowSchema]) holding a table with the live table's name, created
//     with CREATE TABLE ... (LIKE live INCLUDING ALL) and put under the live
//     table's row-level security, its policies copied as they are.
//  2. It runs a temporary shared consumer, "<projection>#rebuild" (see
//     [ConsumerName]), from position zero with the ordinary dispatcher
//     machinery. Every pass of that consumer runs with
//     set_config('search_path', '<shadow>, <the connection's search_path>',
//     true), so the projection's handlers, which name their table
//     unqualified, write into the shadow table while the live consumer keeps
//     filling the live table. Handlers of a rebuildable projection must
//     therefore name their table without a schema.
//  3. When the temporary consumer has reached the end of the visible log, one
//     transaction takes the live consumer's pass lock (the same advisory lock
//     the dispatcher takes, so no live pass runs and none is in flight),
//     catches the temporary consumer up once more, drops the live table,
//     moves the shadow table into the live table's schema, sets the live
//     consumer's cursor to the temporary consumer's cursor (reviving it when
//     it was dead; a disabled one stays disabled) and deletes the temporary
//     consumer's row. After the
//     commit the live consumer continues on the new table exactly after the
//     last event the rebuild applied: no event is lost or applied twice.
//
// Writes continue throughout; only the live consumer pauses during the swap
// transaction (milliseconds), and readers of the table wait for the swap's
// table lock. The swap waits at most Config.SwapLockTimeout for its locks
// and is retried.
//
// # What can be rebuilt
//
// Only shared multi-stream projections with a Table. Inline projections,
// side-effect-only projections (Table "": their effects cannot be redone
// into a fresh table), sagas (they append events: a replay would append them
// again) and per-instance projections are refused with [ErrNotRebuildable],
// and so is a projection whose Table another projection names too (the new
// table would hold only the rebuilt projection's rows).
// While the rebuild runs, a handler that appends an event, or writes to any
// table other than the shadow table, aborts it before that write commits: a
// replay must not touch anything but its own table. (The check compares the
// backend's pg_stat_xact write counters at a pass's first event with those
// just before it commits, through the dispatcher's Consumer.BeforeCommit.)
//
// The new table copies the live table's columns, defaults, constraints,
// indexes and comments (LIKE ... INCLUDING ALL), the live table's row-level
// security (enabled and forced as it was, and every policy as it is, Kumiko's
// tenancy policies or hand-written ones, on a tenant_id or not) and the
// tenant role's grants on the table and its columns; the sequences of serial columns stay the live table's, shared
// by the new table's defaults, and pass to it at the swap (the numbering
// goes on). It does not copy triggers, grants to other roles, or foreign
// keys; views that depend on the live table, and policies whose expression
// reads the table itself in a subquery (the copy reads the live table), make
// the swap fail (DROP TABLE without CASCADE) and the rebuild is abandoned.
// The old table is dropped in the swap transaction.
//
// Events deleted by `kumiko events prune` are gone: a rebuild replays what
// the log still holds.
//
// # Interruption
//
// One rebuild of a projection runs at a time (a session advisory lock;
// [ErrRunning] otherwise). A rebuild that fails or is cancelled removes its
// shadow schema and temporary consumer row. A rebuild whose process dies
// (SIGKILL, power loss) leaves both behind; the leftover row pins retention
// like any consumer. The next rebuild of the projection removes the leftover
// and starts over from position zero (it never resumes: the live table's
// shape may have changed meanwhile); [Abandon] removes it without
// rebuilding. The live table and the live consumer are untouched until the
// swap transaction commits.
package rebuild
