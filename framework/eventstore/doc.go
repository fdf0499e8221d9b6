// Package eventstore owns Kumiko's event log in Postgres: the gapless append
// and the horizon reader.
//
// # Ordering
//
// Every event row carries the ordering key (commit_key xid8, position bigint).
// position comes from a CACHE 1 sequence and is the public event id.
// commit_key is GREATEST(pg_current_xact_id(), the stream's previous commit
// key), computed while the append holds the stream's head row lock. A reader
// delivers only rows whose commit_key is below pg_snapshot_xmin of its own
// statement's snapshot, ordered by (commit_key, position): every transaction
// below that horizon has ended, and no row's commit_key is below its own
// transaction's xid, so nothing can appear behind a reader's cursor later.
// See ARCHITECTURE.md §2 for the counterexamples behind each detail.
//
// # Appending
//
// [Append] (and [QueueAppend] for pipelining in a pgx batch) is the only
// writer of the events table. It is one statement per stream: the streams row
// is upserted (or updated with an expected version) first, so the position is
// drawn after the row lock. Several streams in one transaction must be
// appended in [SortStreams] order so that writers lock them in one order.
//
// # Restoring into a new cluster
//
// Commit keys are transaction ids, and a new cluster's transaction ids start
// low: a log restored there with pg_dump and pg_restore lies above the
// horizon (nothing is delivered), and new events sort before the restored
// ones and the consumers' cursors. [CheckCommitKeys] detects it, and its
// [*CommitKeyAheadError] names the repair: raise the cluster's
// transaction-id epoch above the log's keys with pg_resetwal -e before any
// writer starts. pg_upgrade keeps transaction ids and needs nothing.
package eventstore
