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
// # Maintenance
//
// [MountMaintenance] adds, with the same authentication and role, the
// other verbs of the CLI: `kumiko migrate [status]`, `kumiko events prune`,
// `kumiko jobs prune-handled`, `kumiko consumer prune-dead-letters` and
// `kumiko projection rebuild` (packages migrate, retention, jobs and
// rebuild), with the CLI's refusal messages:
//
//	curl -s -H "Authorization: Bearer $TOKEN" localhost:8080/api/admin/migrations
//	curl -s -X POST -H "Authorization: Bearer $TOKEN" localhost:8080/api/admin/migrations/up
//	curl -s -X POST -H "Authorization: Bearer $TOKEN" -d '{"olderThanDays": 30, "dryRun": true}' \
//	  localhost:8080/api/admin/events/prune
//	curl -s -X POST -H "Authorization: Bearer $TOKEN" -d '{"olderThanDays": 90}' \
//	  localhost:8080/api/admin/jobs/handled/prune
//	curl -s -X POST -H "Authorization: Bearer $TOKEN" -d '{"olderThanDays": 90}' \
//	  localhost:8080/api/admin/dead-letters/prune
//	curl -s -X POST -H "Authorization: Bearer $TOKEN" -d '{"batchSize": 1000}' \
//	  localhost:8080/api/admin/projections/orders:order-totals/rebuild
//
// A prune with bad input (olderThanDays missing or below 1, a type neither
// declared nor in the log, a types list naming none, an unknown field) is a 400 and deletes
// nothing; the consumer check's refusal is a 409 with details reason
// "consumers_behind" and the lagging consumers, another prune running a
// 409 with reason "prune_running". The HandledOnce-claims and dead-letters
// prunes answer {"olderThanDays": N, "deleted": count}; without
// olderThanDays, out of range or with another field they are a 400 and
// delete nothing. A rebuild of an unknown projection is a
// 404, of one that cannot be rebuilt a 409 with reason "not_rebuildable",
// while another rebuild of it runs a 409 with reason "rebuild_running", and
// one whose handler kept failing on an event a 409 with reason
// "event_failed" (with the event's position and the error). A
// rebuild runs in the request; {"abandon": true} only removes the leftover
// of an interrupted one. A client that disconnects cancels the rebuild,
// which then removes what it built.
//
// # Page
//
// GET /admin is a static page (embedded, no build step) that polls the
// list every 2 seconds and shows every consumer with its status, lag,
// cursor and last error, dead ones highlighted, with buttons for the verbs.
// Open it as /admin#token=<token> (the fragment never reaches the server or
// its logs), or log in so that the browser holds the kumiko_auth cookie.
package admin
