// Package jobs runs a feature's background work on Redis through asynq, in
// two lanes, triggered by committed events, by a cron schedule, or by a
// dispatch.
//
// # Declaring jobs
//
// A feature registers jobs next to its handlers; names are qualified
// "<feature>:job:<name>" and are persistent (never rename one that shipped):
//
//	jobs.OnEvent(f, "render-invoice", orders.Placed, nil,
//		func(ctx context.Context, jc *jobs.Context, e framework.Event[orders.Placed]) error { ... })
//	jobs.Cron(f, "nightly-report", "0 2 * * *", &jobs.Options{Location: berlin},
//		func(ctx context.Context, jc *jobs.Context, t jobs.Tick) error { ... })
//	export := jobs.Manual[ExportInput](f, "export", &jobs.Options{MaxRetries: 3},
//		func(ctx context.Context, jc *jobs.Context, in ExportInput) error { ... })
//
// [Options] choose the lane (RunIn api or worker; both is refused at
// registration), retries and backoff, a timeout, a uniqueness window and a
// priority. Mistakes are registration problems that
// framework.Registry.Build reports at boot with all the others.
//
// # Running a job
//
// A handler gets a [Context]: tenant, user, correlation id and causation id
// (the triggering event's id), and [Context.InTx], a transaction scoped to
// the run's tenant. [HandledOnce] claims a key in the handled table inside
// that transaction, so an effect guarded by it happens once however often
// the job is delivered:
//
//	return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
//		first, err := jobs.HandledOnce(ctx, tx, "invoice:"+e.Payload.OrderID)
//		if err != nil || !first {
//			return err
//		}
//		_, err = tx.Exec(ctx, `INSERT INTO invoices ...`)
//		return err
//	})
//
// Claims stay until [PruneHandled] (`kumiko jobs prune-handled`) deletes
// the old ones.
//
// # How runs are enqueued
//
// Event jobs and transactional dispatches ([Set.DispatchTx], which appends
// jobs:event:dispatched in the caller's transaction) are enqueued by the
// shared system consumer system:consumer:job-trigger ([Runner.Consumer]),
// which reads the event log like any projection. Each run's asynq task id is
// derived from the job and the event's position, and finished runs are kept
// for a dedup window, so a consumer that re-reads a batch (a retried pass, a
// crash before its cursor committed) enqueues nothing twice. There is no
// dual write between the database and Redis: when Redis is unreachable the
// enqueue fails fast, the dispatcher rolls the pass back and retries it with
// backoff without counting the failure (the consumer never turns dead for
// it and holds no transaction while it waits), and everything is enqueued
// once Redis answers again.
//
// Cron jobs: every worker runs the scheduler; each tick is enqueued under a
// task id derived from the job and the tick's time, so any number of
// workers produce one run per tick. [Client.Dispatch] enqueues directly.
// A job that dispatches another ([Context.Dispatch]) derives the child's
// task id from its own run (task id and run id) and the dispatch's place
// in the run, so a retried parent does not run its children twice; a
// child dispatched with a Key records the run that dispatched it, so a
// retry of that run finds its key taken without an error.
//
// # Lanes
//
// Each lane has its asynq queues: kumiko-jobs-api and kumiko-jobs-worker
// (with -high and -low siblings for priorities). [Runner.Run] consumes the
// lanes of its [Config]: the entrypoint gives worker processes the worker
// lane, api processes the api lane only with RunLocalJobs, all-in-one both.
// [Validate] refuses a boot where declared jobs have no Redis, or jobs of
// the api lane have no api process consuming it.
//
// # Operations
//
// [Inspector] lists runs by state and retries archived ones (runs that
// exhausted their retries); `kumiko jobs list` and `kumiko jobs retry` and
// the admin API use it. Metrics: kumiko_jobs_enqueued_total,
// kumiko_jobs_succeeded_total, kumiko_jobs_failed_total,
// kumiko_jobs_retried_total, kumiko_jobs_archived_total (per lane and job),
// kumiko_jobs_queue_depth (per lane) and
// kumiko_jobs_event_to_start_seconds.
package jobs
