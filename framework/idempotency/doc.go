// Package idempotency stores the outcome of idempotent requests in Redis,
// so that a retried request is answered with the first one's response
// instead of running again.
//
// # Protocol
//
// A request with a key calls [Store.Begin] with its [Scope] (tenant, user
// and key: keys of different tenants or users never meet) and a fingerprint
// of what it asks for. Begin runs one Lua script that
//
//   - claims a free key with a pending marker: an owner token, the
//     fingerprint and a lease. The caller gets a [Claim], runs the request
//     and stores its response with [Claim.Finish];
//   - answers a finished key with its stored [Response] (a replay);
//   - reports [ErrKeyReused] when the fingerprint differs;
//   - reclaims a pending key whose lease ran out (its owner crashed) for
//     the caller, with a new owner token;
//   - otherwise leaves a pending key alone: Begin then polls with backoff
//     until the owner finishes (and replays its response), the lease runs
//     out (and claims), or [Config].WaitTimeout passes ([ErrInProgress]).
//
// While a claim is held, a timer of the [Claim] renews its lease every
// third of [Config].Lease, so only a crashed (or cut off) owner loses it.
// Finish and renewal are compare-and-set scripts on the owner token: an
// owner whose claim was taken over can never overwrite the newer owner's
// result ([ErrNotOwner]).
//
// [Claim.FinishAsync] stores the response in the background, so that the
// caller answers its client without waiting for Redis: the next Begin
// (whichever key it claims) sends the responses queued before it ahead of
// its claim, in the same pipeline, or the [Store] sends them itself after
// 2 ms. A duplicate's claim thus finds the response it waits for already
// stored. [Store.Close] waits for those at shutdown.
//
// # A Redis that forgets
//
// A Redis restarted empty (or flushed) has forgotten the claims of
// requests still running. Their keys are not left to the next request to
// claim afresh and run again: a waiting Begin that saw the key pending and
// finds it gone restores that owner's pending record (and goes on
// waiting), the owner's next renewal restores it too, and its finish
// stores the response into a record that is gone. A released key leaves a
// record in state released, so that a waiter tells it from a forgotten
// one and claims it at once.
//
// Redis time is the clock of every lease, so API instances with skewed
// clocks agree on them. Keys live for [Config].TTL (default 24 h) past the
// end of the lease set by the claim, again by each renewal (so a request
// running longer than the TTL keeps its key, and a dead owner's key is
// remembered for the TTL after its lease ran out) and for the TTL after the
// finish; a released key's record for a lease. Every Redis failure is returned
// wrapped in [ErrUnavailable]: a keyed request must then not run.
//
// # Layout
//
// One Redis hash per key at "<prefix>:<tenant>:<user>:<key>" (each part
// query-escaped), with the fields state (pending, done or released), owner,
// fp, lease and since (Redis milliseconds), prev (the owner a reclaim took
// the key from), status, header (JSON) and body.
package idempotency
