package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// ConsumerName is the persistent name of the job-trigger consumer's cursor.
const ConsumerName = "system:consumer:job-trigger"

// Config tunes [New]. A nil *Config means the defaults: enqueue only.
type Config struct {
	// Lanes this process consumes (framework.RunInAPI and/or
	// framework.RunInWorker): one asynq server per lane that has jobs.
	// Defaults to none (the process only enqueues).
	Lanes []framework.RunIn
	// Scheduler runs the cron scheduler in this process (every worker does;
	// the task ids make one run per tick). Defaults to false.
	Scheduler bool
	// QueuePrefix prefixes the lanes' queue names. Processes of one
	// application must agree on it. Defaults to [DefaultQueuePrefix].
	QueuePrefix string
	// Concurrency is the number of runs at once per lane (not negative).
	// Defaults to 10.
	Concurrency int
	// MaxTransactions bounds how many of this runner's runs may be inside
	// [Context.InTx] at once: a run's transaction holds a connection of
	// the pool the process shares with its dispatcher and requests, also
	// while it waits on a lock or on an HTTP call, so that without a bound
	// the runs of a lane or two can hold every connection. A run waits for
	// a free slot before its transaction begins. 0 (the default) means no
	// bound; the entrypoint leaves two connections of DATABASE_POOL_MAX to
	// the rest of the process.
	MaxTransactions int
	// TaskCheckInterval is how often an idle lane asks Redis for work; it
	// bounds the latency an idle lane adds. Defaults to 10ms.
	TaskCheckInterval time.Duration
	// RetryCheckInterval is how often runs whose retry delay passed are
	// moved back to their queue. Defaults to 1s.
	RetryCheckInterval time.Duration
	// ShutdownTimeout bounds how long Run waits for runs in flight after
	// its context ended; runs still going are put back on their queue.
	// Defaults to 8s.
	ShutdownTimeout time.Duration
	// DedupRetention is how long a finished run of a derived task id
	// (event, tick, transactional or keyed dispatch) is kept so that its id
	// stays taken: a second enqueue of the same trigger within it is a
	// duplicate. Defaults to 24h.
	DedupRetention time.Duration
	// EnqueueTimeout bounds one enqueue (so that the job-trigger consumer
	// fails fast while Redis is unreachable). Defaults to 2s.
	EnqueueTimeout time.Duration
	// DepthInterval is how often the queue depth gauge of the consumed
	// lanes is sampled. Defaults to 5s.
	DepthInterval time.Duration
	// Logger receives run failures and asynq's warnings. Defaults to
	// discarding.
	Logger *slog.Logger
	// Metrics registers the kumiko_jobs_* collectors. Defaults to none.
	Metrics prometheus.Registerer
}

// Runner runs a registry's jobs on Redis through asynq: it enqueues them
// ([Runner.Client], [Runner.Consumer] for event triggers and transactional
// dispatches, the cron scheduler) and consumes the configured lanes
// ([Runner.Run]).
type Runner struct {
	set     *Set
	rt      *framework.Runtime
	rdb     redis.UniversalClient
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	client  *Client
	// stopping is set when Run starts shutting its lanes down (see
	// interrupted).
	stopping atomic.Bool
	// txSlots holds a token per run inside Context.InTx (nil: no bound,
	// see Config.MaxTransactions).
	txSlots chan struct{}
}

// New returns a runner for the jobs of rt's registry on the Redis client rdb
// (which the runner never closes). It fails on an unknown lane or when the
// metrics cannot be registered.
func New(rt *framework.Runtime, rdb redis.UniversalClient, cfg *Config) (*Runner, error) {
	if rt == nil || rdb == nil {
		return nil, errors.New("jobs: New needs a runtime and a Redis client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	for _, l := range c.Lanes {
		if l != framework.RunInAPI && l != framework.RunInWorker {
			return nil, fmt.Errorf("jobs: lane %q is not api or worker", l)
		}
	}
	if c.Concurrency < 0 || c.MaxTransactions < 0 {
		return nil, fmt.Errorf("jobs: Concurrency (%d) and MaxTransactions (%d) must not be negative", c.Concurrency, c.MaxTransactions)
	}
	c.Lanes = slices.Compact(slices.Sorted(slices.Values(c.Lanes)))
	c.QueuePrefix = cmp.Or(c.QueuePrefix, DefaultQueuePrefix)
	c.Concurrency = cmp.Or(c.Concurrency, 10)
	c.TaskCheckInterval = cmp.Or(c.TaskCheckInterval, 10*time.Millisecond)
	c.RetryCheckInterval = cmp.Or(c.RetryCheckInterval, time.Second)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 8*time.Second)
	c.DedupRetention = cmp.Or(c.DedupRetention, 24*time.Hour)
	c.EnqueueTimeout = cmp.Or(c.EnqueueTimeout, 2*time.Second)
	c.DepthInterval = cmp.Or(c.DepthInterval, 5*time.Second)
	m, err := newMetrics(c.Metrics)
	if err != nil {
		return nil, err
	}
	r := &Runner{
		set: For(rt.Registry()), rt: rt, rdb: rdb, cfg: c,
		log:     cmp.Or(c.Logger, slog.New(slog.DiscardHandler)),
		metrics: m,
	}
	if c.MaxTransactions > 0 {
		r.txSlots = make(chan struct{}, c.MaxTransactions)
	}
	r.client = &Client{
		set: r.set, aq: asynq.NewClientFromRedisClient(rdb), in: asynq.NewInspectorFromRedisClient(rdb), rdb: rdb, prefix: c.QueuePrefix,
		retention: c.DedupRetention, timeout: c.EnqueueTimeout, metrics: m, log: r.log,
	}
	return r, nil
}

// Set returns the runner's job set.
func (r *Runner) Set() *Set { return r.set }

// Client returns the runner's client, to dispatch manual jobs.
func (r *Runner) Client() *Client { return r.client }

// Inspector returns an inspector of the runner's queues.
func (r *Runner) Inspector() *Inspector { return NewInspector(r.rdb, r.cfg.QueuePrefix) }

// Consumer returns the shared system consumer system:consumer:job-trigger:
// it reads the events that trigger jobs and the transactional dispatch
// events, and enqueues each run under a task id derived from the job and the
// event's position, so a re-read (a retried pass, a crash before the cursor
// committed) enqueues nothing twice. While Redis is unreachable its enqueues
// fail fast with an [*EnqueueError], which the dispatcher treats as
// transient: the pass rolls back, the cursor waits with backoff, and the
// consumer never turns dead for it. Other failures (a dispatch of a job this
// build does not have) are dead-lettered so that they cannot block the
// other jobs.
func (r *Runner) Consumer() dispatcher.Consumer {
	return dispatcher.Consumer{
		Name:            ConsumerName,
		EventTypes:      r.set.TriggerTypes(),
		Apply:           r.apply,
		System:          true,
		SkipApplyErrors: true,
		Transient:       IsTransient,
	}
}

// apply enqueues the runs one event triggers.
func (r *Runner) apply(ctx context.Context, _ *framework.Tx, env framework.Envelope) error {
	pos := strconv.FormatInt(env.Position, 10)
	hdr := map[string]string{
		headerCorrelation: cmp.Or(env.Metadata.CorrelationID, pos),
		headerCausation:   pos,
		headerUser:        env.Metadata.UserID,
	}
	if env.Type == r.set.dispatchedType() {
		var d Dispatched
		if err := json.Unmarshal(env.Payload, &d); err != nil {
			return fmt.Errorf("jobs: dispatch event %d: %w", env.Position, err)
		}
		j := r.set.Job(d.Job)
		if j == nil || j.trigger != TriggerManual {
			return fmt.Errorf("jobs: dispatch event %d: %w %q", env.Position, ErrUnknownJob, d.Job)
		}
		id := dispatchTaskID(j.name, env.Position)
		if d.Key != "" {
			id = keyTaskID(j.name, env.TenantID, d.Key)
		}
		_, err := r.client.enqueue(ctx, j, &wire{Tenant: env.TenantID, Payload: d.Payload}, id, hdr, true)
		return err
	}
	jobs := r.set.forEvent(env.Type)
	if len(jobs) == 0 {
		return nil
	}
	hdr[headerEventAt] = env.CreatedAt.Format(time.RFC3339Nano)
	w := &wire{Tenant: env.TenantID, Event: toWireEvent(env)}
	for _, j := range jobs {
		if _, err := r.client.enqueue(ctx, j, w, eventTaskID(j.name, env.Position), hdr, true); err != nil {
			return err
		}
	}
	return nil
}

// Run consumes the configured lanes and runs the cron scheduler until ctx
// ends, then stops pulling work, waits up to ShutdownTimeout for runs in
// flight and returns nil. It fails only when a lane's server cannot start.
// While Redis is unreachable the lanes keep retrying; nothing is lost.
func (r *Runner) Run(ctx context.Context) error {
	var servers []*asynq.Server
	shutdown := func() {
		r.stopping.Store(true)
		var wg sync.WaitGroup
		for _, s := range servers {
			s.Stop()
		}
		for _, s := range servers {
			wg.Go(s.Shutdown)
		}
		wg.Wait()
	}
	for _, lane := range r.cfg.Lanes {
		jobs := r.set.InLane(lane)
		if len(jobs) == 0 {
			continue
		}
		mux := r.laneHandler(lane, jobs)
		srv := asynq.NewServerFromRedisClient(r.rdb, asynq.Config{
			Concurrency:              r.cfg.Concurrency,
			Queues:                   r.listenTo(ctx, lane, jobs),
			TaskCheckInterval:        r.cfg.TaskCheckInterval,
			DelayedTaskCheckInterval: r.cfg.RetryCheckInterval,
			RetryDelayFunc:           r.retryDelay,
			ShutdownTimeout:          r.cfg.ShutdownTimeout,
			ErrorHandler:             r.failed(lane),
			Logger:                   asynqLogger{r.log},
			LogLevel:                 asynq.WarnLevel,
		})
		if err := srv.Start(mux); err != nil {
			shutdown()
			return fmt.Errorf("jobs: start %s lane: %w", lane, err)
		}
		servers = append(servers, srv)
		r.metrics.startLane(string(lane), jobs)
		r.log.Info("job lane started", "lane", string(lane), "jobs", len(jobs), "concurrency", r.cfg.Concurrency,
			"max_transactions", r.cfg.MaxTransactions)
	}
	var wg sync.WaitGroup
	if r.cfg.Scheduler {
		for _, j := range r.set.Jobs() {
			if j.trigger == TriggerCron && j.sched != nil {
				wg.Go(func() { r.runCron(ctx, j) })
			}
		}
	}
	if len(servers) > 0 {
		wg.Go(func() { r.sampleDepth(ctx) })
	}
	<-ctx.Done()
	wg.Wait()
	shutdown()
	return nil
}

// listenTo returns the queues a lane's server consumes: those of its
// jobs' priorities (see laneQueues), and the lane's other priority queues
// that Redis already has. A release that changed a job's priority leaves
// the runs the earlier build enqueued (and archived runs an operator
// retries later) in the old priority's queue, which no job of this build
// would make the lane listen to. When the queues cannot be read, the lane
// listens to all three.
func (r *Runner) listenTo(ctx context.Context, lane framework.RunIn, jobs []*Job) map[string]int {
	queues := laneQueues(r.cfg.QueuePrefix, lane, jobs)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.EnqueueTimeout)
	defer cancel()
	// asynq records every queue it enqueued to in this set (its storage
	// layout, as taskKey).
	known, err := r.rdb.SMembers(ctx, "asynq:queues").Result()
	if err != nil {
		r.log.Warn("job queues unreadable; the lane listens to all its priority queues", "lane", string(lane), "error", err)
	}
	for p, w := range priorityWeight {
		if q := QueueName(r.cfg.QueuePrefix, lane, p); err != nil || slices.Contains(known, q) {
			queues[q] = w
		}
	}
	return queues
}

// retryDelay is asynq's RetryDelayFunc: the job's Backoff for the
// (n+1)-th failed run, stretched to a whole second (see wholeSecondDelay).
// A run whose lease ran out (its worker died: SIGKILL, a lost node) did
// not fail: it runs again at once, not after the job's Backoff, which may
// be hours by then; its worker's death has already cost the minute or two
// asynq takes to see the lease run out.
func (r *Runner) retryDelay(n int, err error, t *asynq.Task) time.Duration {
	if errors.Is(err, asynq.ErrLeaseExpired) {
		return 0
	}
	backoff := DefaultBackoff
	if j := r.set.Job(t.Type()); j != nil {
		backoff = j.opts.Backoff
	}
	return wholeSecondDelay(time.Now(), backoff(n+1))
}

// wholeSecondDelay returns the delay from now to the first whole second at
// or after now+d. asynq keeps a retry's due time in whole seconds, cut
// off (it adds the delay to its own, later, clock reading and stores the
// Unix second), and runs the retry once that second has begun: a delay
// handed over as it is came back up to a second early, so that a Backoff
// of 600 ms retried at once and DefaultBackoff's first second ±20% could
// be a tenth of it.
func wholeSecondDelay(now time.Time, d time.Duration) time.Duration {
	due := now.Add(max(d, 0))
	if whole := due.Truncate(time.Second); !whole.Equal(due) {
		due = whole.Add(time.Second)
	}
	return due.Sub(now)
}

// laneHandler routes a lane's tasks to their jobs by exact type. (asynq's
// ServeMux matches by prefix: a run of a job this build lacks would run
// the handler of a job whose name is a prefix of its name.) A task of a
// job this build does not declare fails as a run of that job, see
// [Runner.undeclared].
func (r *Runner) laneHandler(lane framework.RunIn, jobs []*Job) asynq.Handler {
	handlers := make(map[string]asynq.Handler, len(jobs))
	for _, j := range jobs {
		handlers[j.name] = r.handler(lane, j)
	}
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		if h, ok := handlers[t.Type()]; ok {
			return h.ProcessTask(ctx, t)
		}
		return r.undeclared(ctx, lane, t)
	})
}

// undeclared fails a run of a job this build does not declare in the lane
// (renamed or removed by a release while runs still waited, or declared
// by another release running beside this one). It is counted and logged
// under the task's type like any failed run, so kumiko_jobs_archived_total
// shows it once its retries are exhausted; until then a process that does
// declare it may take it.
func (r *Runner) undeclared(ctx context.Context, lane framework.RunIn, t *asynq.Task) error {
	start := time.Now()
	jc := &Context{Job: t.Type(), Lane: lane}
	jc.TaskID, _ = asynq.GetTaskID(ctx)
	jc.Retry, _ = asynq.GetRetryCount(ctx)
	jc.MaxRetry, _ = asynq.GetMaxRetry(ctx)
	jc.MaxRetry = max(jc.MaxRetry-crashReserve, 0)
	h := t.Headers()
	jc.CorrelationID, jc.CausationID, jc.UserID = h[headerCorrelation], h[headerCausation], h[headerUser]
	var err error = fmt.Errorf("%w %q: not declared in the %s lane of this build", ErrUnknownJob, t.Type(), lane)
	if jc.Retry >= jc.MaxRetry {
		err = lastAttempt{err}
	}
	return &runFailure{error: err, jc: jc, start: start}
}

// handler runs one job's tasks of a lane.
func (r *Runner) handler(lane framework.RunIn, j *Job) asynq.HandlerFunc {
	return func(ctx context.Context, t *asynq.Task) (err error) {
		start := time.Now()
		jc := &Context{Job: j.name, Lane: lane, rt: r.rt, client: r.client, children: &children{}, txSlots: r.txSlots}
		jc.TaskID, _ = asynq.GetTaskID(ctx)
		jc.Retry, _ = asynq.GetRetryCount(ctx)
		jc.MaxRetry = j.maxRetry()
		if m, ok := asynq.GetMaxRetry(ctx); ok {
			// asynq archives the run by the limit it was enqueued with
			// (plus crashReserve): a release that raised the job's limit
			// cannot lengthen the runs the earlier one enqueued, and their
			// last allowed attempt must archive them here, counted as such.
			jc.MaxRetry = min(jc.MaxRetry, max(m-crashReserve, 0))
		}
		h := t.Headers()
		jc.CorrelationID, jc.CausationID, jc.UserID = h[headerCorrelation], h[headerCausation], h[headerUser]
		jc.run = h[headerRun]
		// One sample per run: a retry is no new delivery of the event, and
		// its age then would measure the backoff; nor is a restart of a run
		// a worker's shutdown put back on its queue (see firstStart).
		if v := h[headerEventAt]; v != "" && jc.Retry == 0 {
			if at, perr := time.Parse(time.RFC3339Nano, v); perr == nil && r.firstStart(ctx, jc) {
				r.metrics.eventToStart.WithLabelValues(string(lane), j.name).Observe(start.Sub(at).Seconds())
			}
		}
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("jobs: %s: panic: %v", j.name, v)
			}
			if err == nil {
				r.finish(jc, start, nil)
				return
			}
			if r.interrupted(ctx) {
				// asynq put the run back on its queue: it neither failed
				// nor is archived, and it keeps its uniqueness lock.
				r.log.Warn("job interrupted by shutdown", append(r.attrs(jc, start), "error", err)...)
			}
			if jc.Retry >= jc.MaxRetry && !errors.Is(err, SkipRetry) {
				// Archive now: the task's remaining attempt is kept for
				// a worker that dies during a run (crashReserve).
				err = lastAttempt{err}
			}
			// Counted (and its Unique lock freed) by failed, once asynq
			// takes it as a failure.
			err = &runFailure{error: err, jc: jc, start: start, unique: j.opts.Unique > 0}
		}()
		jc.CorrelationID = cmp.Or(jc.CorrelationID, jc.TaskID)
		var overran bool
		jc, overran, err = r.bounded(ctx, j, jc, t.Payload())
		if overran {
			r.log.Warn("job still running past its timeout; abandoned", r.attrs(jc, start)...)
		}
		return err
	}
}

// timeoutGrace is how long a run may take to return after its Timeout
// ended its context before the runner stops waiting for it (see
// [Runner.bounded] and asynqTimeout).
const timeoutGrace = time.Second

// bounded runs j's handler within the job's exact Timeout. A handler that
// has not returned timeoutGrace after its context ended is abandoned (it
// goes on in its goroutine, as asynq leaves it at its own deadline): the
// run fails with the context's error and overran is set, and the returned
// Context is a copy of what the runner set, with the task's tenant (the
// handler may still write jc). Waiting for it would let asynq's deadline pass first, which asynq
// answers on its own (retrying a last attempt on the crash reserve). A
// panic in the handler is returned as an error.
func (r *Runner) bounded(ctx context.Context, j *Job, jc *Context, payload []byte) (_ *Context, overran bool, _ error) {
	rctx, cancel := context.WithTimeout(ctx, j.opts.Timeout)
	defer cancel()
	snap := &Context{Job: jc.Job, TaskID: jc.TaskID, Lane: jc.Lane, UserID: jc.UserID, CorrelationID: jc.CorrelationID,
		CausationID: jc.CausationID, Retry: jc.Retry, MaxRetry: jc.MaxRetry}
	jc.runCtx = rctx
	res := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				res <- fmt.Errorf("jobs: %s: panic: %v", j.name, v)
			}
		}()
		res <- j.run(rctx, jc, payload)
	}()
	select {
	case err := <-res:
		return jc, false, err
	case <-rctx.Done():
	}
	grace := time.NewTimer(timeoutGrace)
	defer grace.Stop()
	select {
	case err := <-res:
		return jc, false, err
	case <-grace.C:
		// The handler set the tenant on jc from the payload, which the
		// copy, taken before, lacks; the task names it.
		var w struct {
			Tenant string `json:"tenant"`
		}
		_ = json.Unmarshal(payload, &w)
		snap.TenantID = w.Tenant
		return snap, true, fmt.Errorf("jobs: %s: run did not return within %s of its end: %w", j.name, timeoutGrace, rctx.Err())
	}
}

// interrupted reports whether asynq gave up on a run in flight because
// the runner's ShutdownTimeout passed: it then puts the run back on its
// queue, unchanged, and only afterwards ends the run's context (with
// context.Canceled; a run's Timeout ends it with DeadlineExceeded, and
// asynq counts that as a failure). What the handler returns then is no
// outcome of the run.
func (r *Runner) interrupted(ctx context.Context) bool {
	return r.stopping.Load() && errors.Is(ctx.Err(), context.Canceled)
}

// markStartedScript sets the started mark of a run's task hash (KEYS[1])
// and returns 1 if the hash exists and had none; it creates no hash for a
// run an operator deleted meanwhile.
var markStartedScript = redis.NewScript(`if redis.call("EXISTS", KEYS[1]) == 0 then return 0 end
return redis.call("HSETNX", KEYS[1], "kumiko_started", "1")`)

// firstStart reports whether a run's first attempt starts for the first
// time. A run still going when a worker's ShutdownTimeout passes is put
// back on its queue unchanged, its retry count still 0, so the retry count
// alone cannot tell its restart from its start; the runner marks the
// task's hash (asynq's storage layout, see taskKey, which asynq deletes
// with the run) when it first starts. When Redis cannot be asked it
// reports true: a sample too many rather than none.
func (r *Runner) firstStart(ctx context.Context, jc *Context) bool {
	queue, _ := asynq.GetQueueName(ctx)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.EnqueueTimeout)
	defer cancel()
	n, err := markStartedScript.Run(ctx, r.rdb, []string{taskKey(queue, jc.TaskID)}).Int()
	return err != nil || n == 1
}

// runFailure is what a run's handler returns to asynq when the run
// failed: the error, with what [Runner.failed] needs to count it.
type runFailure struct {
	error
	jc     *Context
	start  time.Time
	unique bool
}

// Unwrap returns the run's error.
func (e *runFailure) Unwrap() error { return e.error }

// failed is a lane's asynq ErrorHandler: it counts and logs a failed run
// and frees the uniqueness lock of a Unique job's run that asynq is about
// to archive (see [Runner.releaseUnique]). asynq calls it only when it
// retries or archives the run, not when its ShutdownTimeout passed and it
// put the run back on its queue, which it may do even after the handler
// returned its error: what asynq then throws away is no outcome of the run,
// and counting it in the handler counted a run as failed (or archived, its
// Unique lock freed, so an equal run could start) that was to run again.
// A run asynq failed before its handler returned (its deadline passed, its
// lease ran out, an operator canceled it) is counted from the task.
func (r *Runner) failed(lane framework.RunIn) asynq.ErrorHandlerFunc {
	return func(ctx context.Context, t *asynq.Task, err error) {
		var rf *runFailure
		if !errors.As(err, &rf) {
			rf = r.unreturned(ctx, lane, t, err)
		}
		if rf.unique && errors.Is(rf.error, SkipRetry) {
			queue, _ := asynq.GetQueueName(ctx)
			r.releaseUnique(ctx, rf.jc, queue)
		}
		r.finish(rf.jc, rf.start, rf.error)
	}
}

// unreturned describes a run that asynq failed with err before its
// handler returned (whose later return asynq ignores).
func (r *Runner) unreturned(ctx context.Context, lane framework.RunIn, t *asynq.Task, err error) *runFailure {
	jc := &Context{Job: t.Type(), Lane: lane}
	jc.TaskID, _ = asynq.GetTaskID(ctx)
	jc.Retry, _ = asynq.GetRetryCount(ctx)
	limit, _ := asynq.GetMaxRetry(ctx)
	jc.MaxRetry = max(limit-crashReserve, 0)
	h := t.Headers()
	jc.CorrelationID, jc.CausationID, jc.UserID = h[headerCorrelation], h[headerCausation], h[headerUser]
	var w struct {
		Tenant string `json:"tenant"`
	}
	_ = json.Unmarshal(t.Payload(), &w)
	jc.TenantID = w.Tenant
	if jc.Retry >= limit && !errors.Is(err, SkipRetry) {
		// asynq archives it: even the crash reserve is spent.
		err = lastAttempt{err}
	}
	j := r.set.Job(t.Type())
	return &runFailure{error: err, jc: jc, start: time.Now(), unique: j != nil && j.opts.Unique > 0}
}

// releaseUniqueScript deletes a uniqueness lock (KEYS[1]) if the run
// ARGV[1] still holds it.
var releaseUniqueScript = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0`)

// retryingField marks, in the task hash of an archived run, an operator's
// retry that took the run's Unique window and has yet to put the run back
// on its queue (see [Inspector.Retry]); its value is when, in ms on
// Redis's clock. retryingFor bounds how long the mark keeps
// releaseStaleUnique off the lock: the retry moves the run on at once, and
// a retry whose process died in between must not hold the window for
// long.
const (
	retryingField = "kumiko_retrying"
	retryingFor   = time.Minute
)

// staleUniqueScript frees a uniqueness lock (KEYS[1]) whose holder's task
// (key ARGV[1] .. holder) is archived, without a retry's fresh mark
// (retryingField, younger than ARGV[2] ms), or gone; it answers 1 when
// the lock is free now, else 0. One script, so that no retry takes the
// lock between the look at its holder and the delete.
var staleUniqueScript = redis.NewScript(`local holder = redis.call("GET", KEYS[1])
if not holder then return 1 end
local h = redis.call("HMGET", ARGV[1] .. holder, "state", "` + retryingField + `")
if h[1] and h[1] ~= "archived" then return 0 end
if h[1] and h[2] then
  local t = redis.call("TIME")
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(h[2]) < tonumber(ARGV[2]) then return 0 end
end
redis.call("DEL", KEYS[1])
return 1`)

// releaseStaleUnique frees the uniqueness lock key of queue when the run
// holding it (its value) is archived, or gone, and reports whether it did
// (or found the lock free). A handler that returns frees its run's lock
// before asynq archives it (see [Runner.releaseUnique]), but asynq also
// archives runs whose handler never returned: one whose workers died in
// its last attempts (its recoverer archives it when the lease runs out),
// one whose lock could not be freed while Redis failed. Such a lock would
// refuse every equal run for the rest of its window, though an archived
// run neither waits nor runs. A lock an operator's retry took for its
// archived run, which asynq has yet to mark pending, is not stale.
func releaseStaleUnique(ctx context.Context, rdb redis.UniversalClient, queue, key string) (bool, error) {
	freed, err := staleUniqueScript.Run(ctx, rdb, []string{key}, taskKey(queue, ""), retryingFor.Milliseconds()).Int()
	if err != nil {
		return false, err
	}
	return freed == 1, nil
}

// releaseUnique frees the uniqueness lock of a Unique job's run that asynq
// is about to archive. asynq frees it only when a run succeeds, so an
// archived run would refuse every equal enqueue for the rest of the window
// although it neither waits nor runs (see [Options.Unique]), and the
// job-trigger consumer would drop such dispatches as duplicates. A failure
// to free it is logged; the lock then expires with its window.
func (r *Runner) releaseUnique(ctx context.Context, jc *Context, queue string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.EnqueueTimeout)
	defer cancel()
	// asynq records the lock's key in the task's hash.
	key, err := r.rdb.HGet(ctx, taskKey(queue, jc.TaskID), "unique_key").Result()
	if err == nil && key != "" {
		err = releaseUniqueScript.Run(ctx, r.rdb, []string{key}, jc.TaskID).Err()
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		r.log.Warn("job uniqueness lock not released", "job", jc.Job, "task_id", jc.TaskID, "error", err)
	}
}

// finish counts and logs a run's outcome.
func (r *Runner) finish(jc *Context, start time.Time, err error) {
	lane, job := string(jc.Lane), jc.Job
	if err == nil {
		r.metrics.succeeded.WithLabelValues(lane, job).Inc()
		if r.log.Enabled(context.Background(), slog.LevelDebug) {
			r.log.Debug("job succeeded", r.attrs(jc, start)...)
		}
		return
	}
	attrs := r.attrs(jc, start)
	r.metrics.failed.WithLabelValues(lane, job).Inc()
	attrs = append(attrs, "error", err)
	if errors.Is(err, SkipRetry) {
		r.metrics.archived.WithLabelValues(lane, job).Inc()
		r.log.Error("job archived", attrs...)
		return
	}
	r.metrics.retried.WithLabelValues(lane, job).Inc()
	r.log.Warn("job failed, will retry", attrs...)
}

// attrs are the log attributes of a run.
func (r *Runner) attrs(jc *Context, start time.Time) []any {
	return []any{"job", jc.Job, "lane", string(jc.Lane), "task_id", jc.TaskID, "tenant_id", jc.TenantID,
		"correlation_id", jc.CorrelationID, "causation_id", jc.CausationID, "retry", jc.Retry,
		"duration_ms", float64(time.Since(start).Microseconds()) / 1000}
}

// sampleDepth refreshes the queue depth gauge of the consumed lanes.
func (r *Runner) sampleDepth(ctx context.Context) {
	in := r.Inspector()
	t := time.NewTicker(r.cfg.DepthInterval)
	defer t.Stop()
	for {
		for _, lane := range r.cfg.Lanes {
			if d, err := in.Depth(ctx, lane); err == nil {
				r.metrics.depth.WithLabelValues(string(lane)).Set(float64(d))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// asynqLogger routes asynq's logs to slog with static messages.
type asynqLogger struct{ log *slog.Logger }

func (l asynqLogger) Debug(args ...any) { l.log.Debug("asynq debug", "detail", fmt.Sprint(args...)) }
func (l asynqLogger) Info(args ...any)  { l.log.Debug("asynq info", "detail", fmt.Sprint(args...)) }
func (l asynqLogger) Warn(args ...any)  { l.log.Warn("asynq warning", "detail", fmt.Sprint(args...)) }
func (l asynqLogger) Error(args ...any) { l.log.Error("asynq error", "detail", fmt.Sprint(args...)) }
func (l asynqLogger) Fatal(args ...any) { l.log.Error("asynq fatal", "detail", fmt.Sprint(args...)) }
