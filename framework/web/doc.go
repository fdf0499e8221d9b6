// Package web is Kumiko's HTTP contract on echo v4: the command endpoints
// browser clients call, the one error envelope every failure is rendered in,
// request and correlation ids, and JWT authentication.
//
// # Endpoints
//
// [New] returns a [Server] with three authenticated routes:
//
//   - POST /api/write {type, payload, requestId?} runs one write handler in
//     one transaction and answers 200 {"data": <result>}.
//   - POST /api/batch {commands: [{type, payload}, ...], requestId?} runs
//     1 to 100 writes in one transaction, all or nothing, and answers
//     200 {"data": [<result>, ...]}. A failure is the failing command's
//     envelope with details.index naming it (0-based).
//   - POST /api/query {type, payload} runs one query handler in a read-only
//     transaction and answers 200 {"data": <result>}.
//
// The body's requestId is accepted and not yet used: it will be an
// idempotency key, not the request id. Other packages add their routes
// (SSE, admin, health) through [Server.Echo], protecting them with
// [Server.Authenticate].
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
