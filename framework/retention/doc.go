// Package retention deletes old events from the log: `kumiko events prune`.
//
// # What is deleted
//
// [Prune] deletes events of the selected types created before now minus
// OlderThanDays. By default the selected types are the registry's pub/sub
// types (declared with framework.EventOptions{PubSub: true}): notifications
// that belong to no aggregate's history. Aggregate events carry
// Aggregate.Load, asOf reads and projection rebuilds; deleting them breaks
// those, so they are pruned only when named explicitly. A named type the
// code no longer declares is accepted while the log holds events of it (a
// removed feature's events can be pruned). A stream's row in
// the streams table is never deleted, so a stream keeps its version and the
// next append continues after it.
//
// # The lag guard
//
// Prune refuses ([*LagError]) while any consumer that is not disabled and
// reads one of the selected types has not passed a candidate event, that is,
// while a candidate's (commit_key, position) lies after the consumer's
// cursor. Dead consumers count: they will resume where they stopped. The
// error names the consumers; `kumiko consumer skip` or `kumiko consumer
// disable` lets the prune go ahead.
//
// The guard depends on two invariants, and each needs the other:
//
//  1. The dispatcher pre-registers every consumer's state row (cursor at
//     the start of the log) before its first pass, so a consumer that has
//     started but not yet run is visible to the guard. A shared consumer
//     the registry passed to Prune declares (a projection or saga, the job
//     trigger) that has no row yet (a new release's, before its first
//     worker started) counts as registered at the start of the log, with
//     the declared types ([StatusUnregistered]); a row of a declared
//     consumer counts with the declared types besides its own. A registry
//     of an older release does not know what a newer one adds: prune with
//     the newest release's registry.
//  2. The prune transaction holds LOCK TABLE event_consumers IN SHARE MODE
//     from before its snapshot until it commits: no consumer row can be
//     inserted or moved while the guard's answer is being acted on. The
//     transaction runs at REPEATABLE READ, so the guard and the DELETE see
//     the same events: an old event committed after the guard looked
//     (a long transaction) is neither checked nor deleted.
//
// One prune runs at a time (a session advisory lock); a second one fails
// with [ErrPruneRunning]. The tenant role cannot delete events at all
// (REVOKE DELETE); Prune runs as the connecting owner.
package retention
