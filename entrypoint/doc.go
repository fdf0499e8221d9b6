// Package entrypoint builds a Kumiko process from configuration and a
// feature list: the API process, the worker, or both in one (APP_MODE), with
// the lifecycle starting → ready → draining → stopped.
//
// # Modes
//
// What each mode runs (ARCHITECTURE.md §7):
//
//	mode        HTTP                     shared consumers    per-instance consumers (SSE)  job lanes
//	api         API, SSE, health         none                yes                           api, only with RunLocalJobs
//	worker      health + metrics only    runIn worker/both   no                            worker
//	all-in-one  API, SSE, health         all                 yes                           api and worker
//
// A worker with nothing to run refuses to boot. The API and all-in-one
// processes build an SSE hub ([sse.Hub]) fed by the per-instance consumer
// system:consumer:sse-broadcast and serve GET /api/sse; the all-in-one
// process with Config.Dev (KUMIKO_DEV=1) also serves GET /dev/token, the
// demo page's development token, and no other mode ever does.
// Options.Routes adds the application's own routes (the sample app's demo
// page).
//
// # Lifecycle
//
// A process starts without the database: what needs it (positioning the SSE
// hub, registering the consumers) is retried with backoff, and readiness
// answers 503 until that has succeeded.
//
// [App.Run] serves until its context ends (SIGTERM or SIGINT in `kumiko
// serve`), then drains: readiness turns 503 at once and the listener stops
// accepting, open SSE streams end cleanly, in-flight requests finish, the
// dispatcher finishes its pass, the job lanes shut down, the shutdown hooks
// run in reverse order of registration and the pools close. It returns nil
// (exit 0), or an error wrapping [ErrDrainTimeout] (exit 1) when
// Config.DrainTimeout fired first, naming the step it cut off (and wrapping
// the failure that stopped the process too, when one did).
//
// # Health
//
// GET /health/live answers 200 while the process runs. GET /health/ready
// answers {status, state, checks:[{name, ok, latencyMs, error?}]} within
// 2 s: database, redis, migrations, tenant_role (the database user may SET
// ROLE kumiko_tenant), event_log (the log's commit keys are below the
// server's transaction ids, which a dump restored into a new cluster breaks;
// see eventstore.CheckCommitKeys), sse (the hub is positioned), consumers
// (the dispatcher has registered its consumers' state rows) and, with
// KUMIKO_READY_MAX_LAG (or Options.ReadyMaxLag), consumer_lag; 503 unless every check passed and the
// state is ready. The tenant_role and event_log problems are also logged as
// an ERROR at boot; while event_log fails (checked at boot before anything
// writes, then every Options.EventLogCheckInterval and by each readiness
// probe), writes are paused with 503 unavailable, since an event appended
// then would never be delivered; they stay paused, too, until a first check
// has answered. While migrations of Options.Migrations are pending, the
// dispatcher and the job runner do not start (they would run the release's
// handlers against the old schema); the process checks every second and
// starts them once `kumiko migrate` has run. GET /metrics serves the process's Prometheus registry
// (Go and process collectors, HTTP, dispatcher, SSE, jobs metrics). A worker
// serves the three on WORKER_HTTP_ADDR.
package entrypoint
