// Package sse streams the event log to browsers: GET /api/sse with
// Server-Sent Events, resumable with Last-Event-ID, fed by a per-instance
// consumer of the dispatcher (ARCHITECTURE.md §8).
//
// # The stream
//
// A request must be authenticated ([web.Server.Authenticate]: bearer token
// or the kumiko_auth cookie, which is what an EventSource sends); the tenant
// comes from the token only, so a client can never subscribe to another
// tenant's events. The query parameters `types` (qualified event types) and
// `streamTypes` (aggregate types), comma-separated or repeated, narrow the
// stream (left out: no filter; present but naming nothing, as ?types=,
// answered 400 validation_error); an undeclared event type is answered 400
// validation_error.
// Internal event types ([framework.EventOptions].Internal, such as
// jobs:event:dispatched, which carries a job's input) are never sent, live
// or replayed, and a filter naming one is answered 400 as well; neither are
// events of types the registry does not declare (removed from the code).
//
// The response starts with a `retry:` hint and the opening frame, and then
// carries one frame per event:
//
//	event: kumiko:open
//	data: {"consistencyToken":"1/6D4ED0B8"}
//
//	id: 7412-1093
//	event: orders:event:placed
//	data: {"id":"7412-1093","position":1093,"type":"orders:event:placed","stream":{"type":"order","id":"0193..."},"version":1,"payload":{...},"correlationId":"...","createdAt":"..."}
//
// The opening frame ([OpenEvent], data [Open]) comes first on every stream,
// fresh or resumed. Its consistency token (also in the
// X-Kumiko-Consistency-Token response header) is a WAL position of the
// primary at or past the commit of every event the stream will not send:
// a client that opened the stream without an id loads its state with it
// (POST /api/query with consistencyToken), so that a read replica that has
// not replayed those events yet is waited for, or the primary answers,
// instead of the client missing them (not loaded, and not sent live). It has
// no id, so it moves no resume point, and its event name is never an event
// type, so an EventSource that listens for event types never sees it. The
// token is read before the response starts (a request without one is a
// 503), so that read carries no heartbeat: a request that waits for it
// (a pool without a free connection) and for its resume id's check (see
// below) for longer than Config.ResumeWait (10 s) is answered 503, retry.
//
// The id is an opaque cursor (the event's commit key and position, the same
// cursor the dispatcher keeps). A comment line (": heartbeat") every 15 s
// keeps proxies from closing an idle stream, also while a replay sends
// nothing (its filter passes none of a backlog). A stream ends when its token
// expires ([web.TokenExpiry]); the client reconnects with a fresh one.
//
// # Resume
//
// A request with Last-Event-ID (the header a reconnecting EventSource sends,
// or the lastEventId query parameter for page code that opens a new
// EventSource) first replays, from the events table and through the
// tenant's row-level security, the events after that cursor, then continues
// live, with no gap and no duplicate. The handoff: the handler subscribes to
// the [Hub] first (from then on live events queue in the client's buffer),
// notes the hub's position P, replays the events after the client's cursor
// up to and including P (all of them are final: the hub only ever receives
// events below the visibility horizon), and then sends the queued live
// events after P, skipping any at or before the last one it sent. Because
// the hub is fed in cursor order, this is exact. The hub's starting position
// is set by [Hub.Prime] at the visibility horizon, so even the first clients
// of a fresh process get everything.
//
// While it replays, the client does not take its buffer, so under steady
// writes a long replay can fill it. That does not drop the client: the
// buffer is emptied, and once the replay reached P the handler notes the
// hub's position again and replays on from the table up to there, in rounds,
// each replaying what arrived during the one before, until one ends with
// every live event since in the buffer (and room for more); then it goes
// live. A client that reads faster than events arrive thus always reaches
// live, however far behind it resumed, without a gap or a duplicate.
//
// The replays share the pool with the writes. Each read of a resuming
// stream (its id's check, each page) holds a connection while it runs, so
// at most Config.ReplayConns of them (a quarter of the pool's MaxConns, at
// least 1) run at once, and a stream takes its turn per page: a burst of
// reconnecting clients (an API instance died, and its browsers resume on
// the others) queues for that share instead of taking every connection and
// leaving the writes to wait. A stream waiting for a page's turn gets its
// heartbeats; the request going away or [Hub.Close] ends the wait. Its
// id's check comes before the response starts (it decides the status), so
// it has none: it takes the next turn, before the pages waiting for one (a
// new resume is answered without waiting for a burst's queued pages), and
// one that still takes longer than Config.ResumeWait (10 s) is answered
// 503, retry, before a proxy's idle timeout cuts the request.
//
// A malformed id (a lastEventId parameter given empty, without the header,
// among them), or one that does not name an event of this log visible to
// the caller's tenant (the event at the id's position must exist, belong to
// the tenant, and carry the id's commit key) is answered 400: another
// tenant's, another deployment's, a forged or a pruned id cannot be resumed
// from, and the client must reconnect without it. So is an id after which
// a retention prune deleted an event of the tenant that the stream's
// filters would have sent: the replay would skip it silently.
//
// # Slow clients
//
// Each client has a bounded buffer (Config.Buffer frames). When an event
// finds it full once the client is live (not while it replays, see Resume),
// or 32 KB of a write do not go out within
// Config.WriteTimeout (the client stopped reading), the client is
// disconnected at once; it reconnects with its last id and catches up by
// replay. One goroutine of the hub fans the events out, a batch at a time
// (whatever accumulated while it delivered the previous one), and never
// waits for a client, so other clients are not delayed; a burst reaches each
// client as one write. The
// gauge kumiko_sse_clients counts connected clients, the counter
// kumiko_sse_dropped_clients_total the disconnected ones.
//
// # Wiring
//
// The entrypoint builds one hub per API or all-in-one process, adds
// [Hub.Consumer] (ConsumerName, per-instance delivery) to the dispatcher,
// calls [Hub.Prime] before the dispatcher starts, mounts [Hub.Mount] on the
// web server and calls [Hub.Close] when draining, so that open streams, live
// or still replaying, end before the HTTP server shuts down.
package sse
