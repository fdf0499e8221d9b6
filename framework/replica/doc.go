// Package replica routes Kumiko's queries to a streaming read replica with
// read-your-writes.
//
// # Routing
//
// A [Router] is the [framework.ReadRouter] of a runtime whose
// DATABASE_READ_URL is set: every query runs on the replica pool; write
// handlers, the dispatcher and jobs never ask it and always use the primary.
//
// # Read-your-writes
//
// Every write answers a consistency token: the primary's WAL position right
// after its COMMIT ([framework.Runtime.WriteWithToken]). A query that sends
// it back takes a replica connection and checks, on that connection, that
// the replica has replayed past the token (pg_last_wal_replay_lsn() >=
// token). While it has not, it polls, for at most [Config.WaitTimeout]
// (default 500 ms), giving the connection back between two checks so
// that other queries use it meanwhile (each check takes one again, and the
// query runs on the connection whose check passed); then the query runs on
// the primary instead and
// kumiko_replica_fallbacks_total counts it. The check runs on the
// connection the query then uses, so a read URL that balances over several
// replicas is still correct. A read server that is not in recovery counts
// as caught up: a primary, a standby promoted by a failover, a primary
// after crash recovery.
//
// A token the replica has not replayed at the first check is compared with
// the primary's WAL insert position (one round trip, skipped for a token
// at or below a position the primary was seen at before). A token ahead of
// it was answered by no write of this database: the query is refused with
// a bad_request [framework.Error] whose cause is
// [framework.ErrConsistencyTokenAhead], instead of waiting the whole bound
// for a replay that cannot come (a made-up token such as
// FFFFFFFF/FFFFFFFF would otherwise hold a query, and the replica
// connection it checks on, for every request that sends it).
//
// # Replica down
//
// When the replica cannot be reached or fails a check, the query runs on
// the primary (kumiko_replica_fallbacks_total{reason="error"}) and so do
// all queries for [Config].Cooldown (default 1 s). A query that loses its
// replica connection before it produced its result (the replica stopped,
// restarted or crashed while it ran) runs once more on the primary, counted
// and starting the cooldown the same way ([framework.ReadFailover]); one
// that loses a primary connection fails 503. A query with a token
// waits for the replica's answers at most twice WaitTimeout, so a replica
// that hangs (takes the connection or the check and never answers) counts
// as failed too; a query without a token has no such bound beyond its
// context, which a hung replica holds until it ends, unless the cooldown
// is already running. A token query that finds every replica connection
// in use by other queries until that bound runs on the primary as a lag
// fallback, without the cooldown: a busy replica has not failed.
//
// # Conflicts with recovery
//
// A hot standby cancels a query that holds back the replay of the
// primary's changes past its max_standby_streaming_delay ("canceling
// statement due to conflict with recovery", SQLSTATE 40001, or 40P01 for a
// buffer pin deadlock). Such a query runs once more on the primary,
// counted as kumiko_replica_fallbacks_total{reason="recovery_conflict"}
// ([Router.ReplicaConflict]); the replica works, so no cooldown starts. A
// 40001 of the primary, or of a read server not in recovery, stays the
// client's 409 conflict.
package replica
