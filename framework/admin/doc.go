// Package admin is Kumiko's authenticated admin HTTP API and its live page.
//
// # API
//
// [Mount] adds, under /api/admin and for callers with the [Role] role, the
// same consumer verbs as the `kumiko consumer` CLI: list, status, restart,
// skip, disable, enable and rewind (see package dispatcher for what each
// does and refuses), plus removing a decommissioned instance's rows.
//
//	TOKEN=$(./bin/kumiko token --tenant acme --user alice --roles admin)
//	curl -s -H "Authorization: Bearer $TOKEN" localhost:8080/api/admin/consumers
//	curl -s -X POST -H "Authorization: Bearer $TOKEN" \
//	  localhost:8080/api/admin/consumers/orders:order-totals/restart
//
// Errors use Kumiko's envelope: 401 unauthorized without a valid token,
// 403 access_denied without the role, 404 not_found for an unknown consumer
// or event, 409 conflict when the consumer's state refuses the verb (with
// details name, instance, verb, status, want), 400 for bad input.
//
// # Page
//
// GET /admin is a static page (embedded, no build step) that polls the
// list every 2 seconds and shows every consumer with its status, lag,
// cursor and last error, dead ones highlighted, with buttons for the verbs.
// Open it as /admin#token=<token> (the fragment never reaches the server or
// its logs), or log in so that the browser holds the kumiko_auth cookie.
package admin
