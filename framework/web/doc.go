// Package web is Kumiko's HTTP contract on echo v4: the command endpoints
// browser clients call, the one error envelope every failure is rendered in,
// request and correlation ids, and JWT authentication.
//
// # Endpoints
//
// [New] returns a [Server] with three authenticated routes:
//
//   - POST /api/write {type, payload, requestId?} runs one write handler in
//     one transaction and answers 200 {"data": <result>, "consistencyToken":
//     <token>}.
//   - POST /api/batch {commands: [{type, payload}, ...], requestId?} runs
//     1 to 100 writes in one transaction, all or nothing, and answers
//     200 {"data": [<result>, ...], "consistencyToken": <token>}. A failure is the failing command's
//     envelope with details.index naming it (0-based).
//   - POST /api/query {type, payload, consistencyToken?} runs one query
//     handler in a read-only transaction and answers 200 {"data": <result>}.
//
// Other packages add their routes (SSE, admin, health) through
// [Server.Echo], protecting them with [Server.Authenticate].
//
// # Idempotent writes
//
// With [Config].Idempotency set, POST /api/write and /api/batch honour an
// Idempotency-Key header or, for Kumiko's browser clients, the body's
// requestId (the header wins; both present and different is 400). Keys are
// scoped by tenant and user. The first request claims the key and its
// response (success or failure) is stored; a retry with the same key and
// the same type and payload gets it byte for byte with Idempotent-Replayed:
// true; a concurrent duplicate waits for it; a retry with another type or
// payload is 422 idempotency_key_reused; a keyed request while the store is
// unreachable is 503 idempotency_unavailable and does not run. The key, the
// claim's owner token and, after a take-over, the previous owner's are
// recorded in the metadata (idempotencyKey, idempotencyOwner,
// idempotencyReclaimedFrom) of the events the write appends; a request that takes over the key of an owner that died (its
// lease ran out) looks for them first and does not run a write that
// committed again: it is answered 409 conflict listing those events; should
// that owner still run and commit the write while the request runs, the
// request commits nothing and is answered 409 conflict too. See
// framework/idempotency for the protocol.
//
// # Read-your-writes
//
// Every successful write and batch answers {"data": ..., "consistencyToken":
// "<token>"} and the X-Kumiko-Consistency-Token header. A query that sends
// the token back (the same header, or consistencyToken in its body) reads
// that write or a later state, also on a read replica, and skips the query
// cache. A malformed token is 400 bad_request.
//
// # Errors
//
// Every error, including echo's own 404 and 405, authentication failures,
// oversized bodies and recovered panics, is answered with one envelope:
//
//	{"error": {"code": "validation_error", "httpStatus": 400,
//	           "message": "...", "details": {...}, "requestId": "..."}}
//
// The codes are the [framework.Code] constants; [WriteError] renders any
// error through [framework.ToError]. Internal errors (code internal, and
// any error that is not a Kumiko error) are shown as "internal error" with
// no details and logged with the request id and the cause. A method the
// route does not serve is answered 405 with code method_not_allowed and
// the Allow header.
//
// # Request and correlation ids
//
// The X-Request-ID header is the request id when it is sane (1 to 128
// printable ASCII characters); otherwise a UUID is generated. The response
// always carries it back in X-Request-ID. X-Correlation-ID (equally sane)
// is the correlation id, else the request id; it is echoed as well. Both go
// into the [framework.Call] of every command, and from there into the
// metadata of the events it appends.
//
// # Authentication
//
// [Server.Authenticate] verifies the HS256 JWT sent as "Authorization:
// Bearer <token>" or in the kumiko_auth cookie with the [auth.Keyring] and
// stores the [auth.Principal] ([PrincipalFrom]); anything else is 401
// unauthorized. A request authenticated by the cookie that changes state
// (any method but GET, HEAD and OPTIONS) must send Content-Type
// application/json, which a cross-site HTML form cannot; otherwise it is
// 403 access_denied. This is the CSRF protection of cookie authentication.
//
// # Input hardening
//
// Bodies above [Config.BodyLimit] are 413 payload_too_large; bodies that are
// not one JSON object, are malformed, nest deeper than [Config.MaxJSONDepth]
// or carry unknown top-level fields are 400 bad_request; a missing type is
// 400 validation_error; an unknown type is 404 not_found with
// details.knownTypes. Any Content-Type is accepted for bearer-authenticated
// requests.
package web
