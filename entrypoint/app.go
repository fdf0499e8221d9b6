package entrypoint

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/admin"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/retry"
)

// State is a process's lifecycle state.
type State string

// The lifecycle states, in order.
const (
	StateStarting State = "starting"
	StateReady    State = "ready"
	StateDraining State = "draining"
	StateStopped  State = "stopped"
)

// Options describe the application a process serves.
type Options struct {
	// Config is the validated process configuration. Required.
	Config *config.Config
	// Register adds the application's features to the registry. Required.
	Register func(r *framework.Registry)
	// Logger receives the process's logs. Defaults to discarding.
	Logger *slog.Logger
	// Migrations is the migration set readiness checks and the dispatcher
	// and the job runner wait for (they start once every migration of it
	// is applied). Defaults to Kumiko's embedded migrations.
	Migrations fs.FS
	// InstanceID overrides Config.InstanceID, checked as KUMIKO_INSTANCE_ID
	// is ([config.CheckInstanceID]). Defaults to the config's value, else a
	// random id.
	InstanceID string
	// Routes adds the application's own routes (pages, webhooks) to the
	// HTTP server of the api and all-in-one modes; they get request ids,
	// the error envelope and the HTTP metrics. Defaults to none.
	Routes func(s *web.Server)
	// ReadyMaxLag, when positive, makes /health/ready fail while a consumer
	// this process runs has more than this many events after its cursor.
	// Defaults to Config.ReadyMaxLag (KUMIKO_READY_MAX_LAG), whose default
	// 0 means that lag is not checked.
	ReadyMaxLag int64
	// SSE tunes the live stream of the api and all-in-one modes (Logger and
	// Metrics are the process's). Defaults to the sse package's defaults.
	SSE *sse.Config
	// EventLogCheckInterval is how often the process checks that the event
	// log can take events (eventstore.CheckCommitKeys) and pauses or
	// resumes writes accordingly; it also checks at boot, before anything
	// writes, every second until a check has answered, and with each
	// readiness probe. Defaults to 10s.
	EventLogCheckInterval time.Duration
}

// App is one built process. Build it with [New], run it with [App.Run].
type App struct {
	cfg        *config.Config
	mode       config.Mode
	log        *slog.Logger
	instanceID string
	migrations fs.FS
	// migrated opens once the migrations are applied; the dispatcher and
	// the job runner wait for it.
	migrated migrationGate

	pool     *pgxpool.Pool
	readPool *pgxpool.Pool
	redis    *redis.Client
	reg      *framework.Registry
	rt       *framework.Runtime
	disp     *dispatcher.Dispatcher
	jobs     *appJobs // entrypoint/jobs.go
	web      *web.Server
	hub      *sse.Hub
	metrics  *prometheus.Registry
	httpSrv  *http.Server
	maxLag   int64
	reads    *appReads // entrypoint/reads.go
	// logCheck is the interval of watchEventLog.
	logCheck time.Duration
	// logMu orders noteEventLog's pauses, resumptions and their log lines.
	logMu sync.Mutex
	// readyMu guards readyRun, the run of the readiness checks that
	// concurrent probes share (entrypoint/health.go).
	readyMu  sync.Mutex
	readyRun *readyRun

	state    atomic.Value // State
	hooksMu  sync.Mutex
	shutdown []func(context.Context) error
	hooksRan bool
}

// New builds the process of cfg.Mode: pools, registry, runtime, consumers
// and HTTP server. It fails at boot with every registration problem, and on
// a reserved instance id.
func New(ctx context.Context, opts Options) (_ *App, err error) {
	if opts.Config == nil || opts.Register == nil {
		return nil, errors.New("entrypoint: Config and Register are required")
	}
	cfg := opts.Config
	if opts.InstanceID != "" {
		if err := config.CheckInstanceID(opts.InstanceID); err != nil {
			return nil, fmt.Errorf("entrypoint: InstanceID: %w", err)
		}
	}
	a := &App{
		cfg:        cfg,
		mode:       cmp.Or(cfg.Mode, config.ModeAllInOne),
		log:        cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)),
		instanceID: cmp.Or(opts.InstanceID, cfg.InstanceID, randomID()),
		migrations: opts.Migrations,
		metrics:    prometheus.NewRegistry(),
		maxLag:     cmp.Or(opts.ReadyMaxLag, cfg.ReadyMaxLag),
		logCheck:   cmp.Or(opts.EventLogCheckInterval, 10*time.Second),
	}
	a.state.Store(StateStarting)
	defer func() {
		if err != nil {
			// Release what was opened before the failure (pools, clients).
			a.runHooks(context.Background())
		}
	}()
	if a.instanceID == dispatcher.SharedInstance {
		return nil, dispatcher.ErrReservedInstance
	}
	a.metrics.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	a.reg = framework.NewRegistry()
	opts.Register(a.reg)
	if err := a.reg.Build(); err != nil {
		return nil, fmt.Errorf("entrypoint: features: %w", err)
	}
	// Jobs (entrypoint/jobs.go): boot validation of the declared jobs.
	if err := a.validateJobs(); err != nil {
		return nil, err
	}

	pc, err := cfg.PoolConfig()
	if err != nil {
		return nil, fmt.Errorf("entrypoint: %w", err)
	}
	if a.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return nil, fmt.Errorf("entrypoint: database pool: %w", err)
	}
	a.onShutdown(func(context.Context) error { a.pool.Close(); return nil })
	if rpc, err := cfg.ReadPoolConfig(); err != nil {
		return nil, fmt.Errorf("entrypoint: %w", err)
	} else if rpc != nil {
		if a.readPool, err = pgxpool.NewWithConfig(ctx, rpc); err != nil {
			return nil, fmt.Errorf("entrypoint: read pool: %w", err)
		}
		a.onShutdown(func(context.Context) error { a.readPool.Close(); return nil })
	}
	ro, err := cfg.RedisOptions()
	if err != nil {
		return nil, fmt.Errorf("entrypoint: %w", err)
	}
	a.redis = redis.NewClient(ro)
	a.onShutdown(func(context.Context) error { return a.redis.Close() })

	if a.rt, err = framework.NewRuntime(a.reg, a.pool, &framework.RuntimeConfig{Logger: a.log, ReadPool: a.readPool}); err != nil {
		return nil, fmt.Errorf("entrypoint: runtime: %w", err)
	}

	if a.mode != config.ModeWorker {
		// The live stream: a hub fed by this instance's own consumer.
		sc := sse.Config{}
		if opts.SSE != nil {
			sc = *opts.SSE
		}
		sc.Logger, sc.Metrics = a.log, a.metrics
		// One pass of the hub's consumer publishes up to a batch at once,
		// and the next may follow before a client's handler took the
		// first: a client that keeps up must not be dropped for that.
		sc.Buffer = max(cmp.Or(sc.Buffer, sse.DefaultBuffer), 2*a.cfg.DispatcherBatchSize)
		if a.hub, err = sse.New(a.pool, a.reg, &sc); err != nil {
			return nil, fmt.Errorf("entrypoint: %w", err)
		}
		a.onShutdown(func(context.Context) error { a.hub.Close(); return nil })
	}
	consumers, reserve := a.consumers()
	// Jobs (entrypoint/jobs.go): the runner of this mode and the
	// job-trigger consumer.
	if consumers, err = a.setupJobs(consumers); err != nil {
		return nil, err
	}
	// Reads (entrypoint/reads.go): replica routing, the entity cache and
	// its invalidation consumer, the idempotency store.
	if consumers, err = a.setupReads(consumers); err != nil {
		return nil, err
	}
	if len(consumers) > 0 || a.mode != config.ModeWorker {
		a.disp, err = dispatcher.New(a.pool, a.reg, consumers, &dispatcher.Config{
			InstanceID:   a.instanceID,
			Logger:       a.log,
			PollInterval: cfg.DispatcherPollInterval,
			PollOnly:     cfg.DispatcherPollOnly,
			BatchSize:    cfg.DispatcherBatchSize,
			Metrics:      a.metrics,
			// 0 (a Config built in code) is the dispatcher's default.
			MaxConcurrentPasses: cfg.DispatcherMaxConcurrentPasses,
			Reserve:             reserve,
		})
		if err != nil {
			return nil, fmt.Errorf("entrypoint: %w", err)
		}
		a.rt.OnCommit(func(int) { a.disp.Wake() })
	}

	switch a.mode {
	case config.ModeAPI, config.ModeAllInOne:
		keys := make([]auth.Key, len(cfg.JWTKeys))
		for i, k := range cfg.JWTKeys {
			keys[i] = auth.Key{ID: k.ID, Secret: k.Secret}
		}
		ring, err := auth.NewKeyring(keys)
		if err != nil {
			return nil, fmt.Errorf("entrypoint: JWT_SECRET: %w", err)
		}
		a.web = web.New(a.rt, ring, &web.Config{Logger: a.log, Metrics: a.metrics})
		a.web.SetIdempotency(a.idempotency()) // entrypoint/reads.go
		a.mountHealth(a.web.Echo())
		a.hub.Mount(a.web)
		admin.Mount(a.web.Echo(), a.web.Authenticate, a.pool)                                 // consumer ops API + /admin page (framework/admin)
		admin.MountMaintenance(a.web.Echo(), a.web.Authenticate, a.pool, a.reg, a.migrations) // migrate, prunes, rebuild
		if a.jobs != nil {
			// Here, not in Serve: routes added to a handler that may be
			// serving race with it, and echo sizes its pooled request
			// contexts for the route parameters known when they are made.
			a.mountJobsAdmin(a.web) // entrypoint/jobs.go
		}
		if a.mode == config.ModeAllInOne && cfg.Dev {
			a.mountDevToken(a.web.Echo(), ring)
		}
		if opts.Routes != nil {
			opts.Routes(a.web)
		}
		a.httpSrv = web.NewHTTPServer(cfg.HTTPAddr, a.web.Handler(), cfg.HTTPReadTimeout, cfg.HTTPIdleTimeout)
	case config.ModeWorker:
		if a.disp == nil {
			return nil, errors.New("entrypoint: worker has nothing to run: no consumers for runIn worker/both")
		}
		// Request ids, errors in the framework's envelope, request logs
		// and HTTP metrics, as on the API port.
		e := web.NewBase(&web.Config{Logger: a.log, Metrics: a.metrics})
		a.mountHealth(e)
		a.httpSrv = web.NewHTTPServer(cfg.WorkerHTTPAddr, e, cfg.HTTPReadTimeout, cfg.HTTPIdleTimeout)
	}
	return a, nil
}

// consumers returns the consumers this mode runs, and those whose state
// rows it registers without running them (dispatcher.Config.Reserve): the
// shared projections with runIn api, which neither an api nor a worker
// process runs (§7). Without a row of theirs in a deployment of api and
// worker processes, the prune counted them as not registered yet for good
// (it keeps what they have not delivered), and no verb could disable them.
func (a *App) consumers() (run, reserve []dispatcher.Consumer) {
	for _, c := range dispatcher.ProjectionConsumers(a.reg, nil) {
		p := a.reg.Projection(c.Name)
		if a.runs(p.Options().RunIn, c.Delivery) {
			run = append(run, c)
		} else if c.Delivery == framework.DeliveryShared && p.Options().RunIn == framework.RunInAPI {
			reserve = append(reserve, c)
			a.log.Warn("a shared projection with runIn api runs only in all-in-one processes: api processes run no shared consumers, workers only runIn worker or both; "+
				"its state row holds back the prune of its event types until an all-in-one process delivers them or it is disabled",
				"projection", c.Name)
		}
	}
	if a.hub != nil {
		run = append(run, a.hub.Consumer())
	}
	return run, reserve
}

// runs applies the mode table (ARCHITECTURE §7) to one consumer: an api
// process runs no shared consumers, only per-instance ones; a worker the
// shared ones of runIn worker or both; all-in-one everything.
func (a *App) runs(runIn framework.RunIn, delivery framework.Delivery) bool {
	switch a.mode {
	case config.ModeAPI:
		return delivery == framework.DeliveryPerInstance
	case config.ModeWorker:
		return delivery != framework.DeliveryPerInstance && (runIn == framework.RunInWorker || runIn == framework.RunInBoth)
	default:
		return true
	}
}

// Runtime returns the process's runtime.
func (a *App) Runtime() *framework.Runtime { return a.rt }

// Registry returns the built registry.
func (a *App) Registry() *framework.Registry { return a.reg }

// Pool returns the primary pool.
func (a *App) Pool() *pgxpool.Pool { return a.pool }

// Redis returns the Redis client.
func (a *App) Redis() *redis.Client { return a.redis }

// Hub returns the SSE hub (nil in worker mode).
func (a *App) Hub() *sse.Hub { return a.hub }

// Dispatcher returns the process's dispatcher (nil when it runs none).
func (a *App) Dispatcher() *dispatcher.Dispatcher { return a.disp }

// Web returns the HTTP server (nil in worker mode).
func (a *App) Web() *web.Server { return a.web }

// Metrics returns the process's Prometheus registry.
func (a *App) Metrics() *prometheus.Registry { return a.metrics }

// InstanceID returns the process's instance id.
func (a *App) InstanceID() string { return a.instanceID }

// State returns the lifecycle state.
func (a *App) State() State { return a.state.Load().(State) }

// onShutdown registers a hook; hooks run in reverse order of registration.
func (a *App) onShutdown(fn func(context.Context) error) {
	a.hooksMu.Lock()
	defer a.hooksMu.Unlock()
	a.shutdown = append(a.shutdown, fn)
}

// OnShutdown registers fn to run at shutdown, after the HTTP server and the
// dispatcher stopped; hooks run in reverse order of registration.
func (a *App) OnShutdown(fn func(context.Context) error) { a.onShutdown(fn) }

// runHooks runs the shutdown hooks once, last registered first; a failing
// hook is logged and the others still run.
func (a *App) runHooks(ctx context.Context) {
	a.hooksMu.Lock()
	hooks := a.shutdown
	ran := a.hooksRan
	a.hooksRan = true
	a.hooksMu.Unlock()
	if ran {
		return
	}
	for i := len(hooks) - 1; i >= 0; i-- {
		if err := hooks[i](ctx); err != nil {
			a.log.Warn("shutdown hook failed", "error", err)
		}
	}
}

// Close releases the resources of an App that was built but will not be
// run (Run releases them itself when it returns): it runs the shutdown
// hooks, which close the pools and clients.
func (a *App) Close(ctx context.Context) {
	a.runHooks(ctx)
	a.state.Store(StateStopped)
}

// ErrDrainTimeout is returned by Run when draining took longer than the
// configured drain timeout. The error Run returns wraps it and says after
// how long, and what the drain was still waiting for when it gave up.
var ErrDrainTimeout = errors.New("entrypoint: drain timeout exceeded")

// The steps of a drain that can outlast the drain timeout, as its error
// names them: what was still running, and what becomes of it.
const (
	drainRequests = "in-flight requests were still running: their connections were cut, and what they had not committed is rolled back"
	drainWork     = "consumer passes or jobs were still running: what they had not committed is rolled back and runs again"
	drainHealth   = "health or metrics requests were still running: their connections were cut"
	drainHooks    = "the shutdown hooks were still running (they close the pools and clients)"
)

// Run serves until ctx ends, then drains: readiness turns 503 at once, SSE
// streams end cleanly, in-flight requests finish, the dispatcher finishes
// its pass, the shutdown hooks run (in reverse order of registration) and
// the pools close. The HTTP server of the api and all-in-one modes stops
// accepting at once; a worker's health and metrics server keeps answering
// until its work has stopped. It returns nil on a clean shutdown, ErrDrainTimeout when the drain
// timeout fired, or the error that stopped the process (both, the failure first, when a process
// that failed then overran its drain timeout: the error matches either with errors.Is). When the drain
// timeout fires, the connections of requests still running are closed (their
// contexts end) and Run returns at once; the shutdown hooks run, and the pools
// close, as soon as those requests have returned.
func (a *App) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.httpSrv.Addr)
	if err != nil {
		// Nothing runs yet, but the pools and clients New opened do.
		a.Close(context.Background())
		return fmt.Errorf("entrypoint: listen %s: %w", a.httpSrv.Addr, err)
	}
	return a.Serve(ctx, ln)
}

// Serve is Run on an existing listener (tests listen on port 0).
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	a.log.Info("process starting", "mode", string(a.mode), "instance_id", a.instanceID, "addr", ln.Addr().String())
	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { a.logTenantRole(workCtx) })
	// Writes wait for the event log's first check (see noteEventLog),
	// which runs here, before anything that writes starts.
	a.rt.BlockWrites(errEventLogUnchecked)
	checkCtx, cancelCheck := context.WithTimeout(workCtx, readyBudget)
	a.noteEventLog(eventstore.CheckCommitKeys(checkCtx, a.pool))
	cancelCheck()
	wg.Go(func() { a.watchEventLog(workCtx) })
	wg.Go(func() { a.runCacheGuard(workCtx) })
	if a.disp != nil {
		wg.Go(func() {
			if !a.migrated.wait(workCtx) {
				return
			}
			// The hub's position must be set before its consumer's first
			// pass (see sse.Hub.Prime).
			if a.hub != nil && !a.primeHub(workCtx) {
				return
			}
			if err := a.disp.Run(workCtx); err != nil {
				errc <- fmt.Errorf("dispatcher: %w", err)
			}
		})
	}
	// Jobs (entrypoint/jobs.go): admin API, asynq lanes, cron scheduler.
	if a.disp != nil || a.jobs != nil {
		wg.Go(func() { a.migrated.run(workCtx, a.pool, a.migrations, a.log) })
	}
	a.runJobs(workCtx, &wg, errc)
	// The HTTP server is not in wg: a worker's health server outlives the
	// work it reports on (see the drain below).
	httpDone := make(chan struct{})
	go func() {
		defer close(httpDone)
		if err := a.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http: %w", err)
		}
	}()
	a.state.Store(StateReady)
	a.log.Info("process ready", "mode", string(a.mode), "instance_id", a.instanceID)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		a.log.Error("process failed", "error", runErr)
	}
	a.state.Store(StateDraining)
	a.log.Info("process draining")
	drainTimeout := cmp.Or(a.cfg.DrainTimeout, 30*time.Second)
	drainCtx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	done := make(chan struct{})
	// step is what the drain waits for, named by the drain timeout's
	// error. A step that ended because the timeout fired leaves it as it
	// is, so the error names the step that was cut off, not the next.
	var step atomic.Pointer[string]
	enter := func(s string) {
		if drainCtx.Err() == nil {
			step.Store(&s)
		}
	}
	go func() {
		defer close(done)
		if a.hub != nil {
			// Open streams never go idle: end them first, or Shutdown
			// would wait for them until the drain timeout.
			a.hub.Close()
		}
		if a.web != nil {
			// API and all-in-one: stop accepting at once (§7).
			enter(drainRequests)
			_ = a.httpSrv.Shutdown(drainCtx)
		}
		enter(drainWork)
		stopWork()
		wg.Wait()
		// A worker accepts no work over HTTP: its health server keeps
		// answering while the worker drains (/health/ready 503 with the
		// state draining, /health/live 200) and stops once the work has.
		if a.web == nil {
			enter(drainHealth)
		}
		_ = a.httpSrv.Shutdown(drainCtx)
		<-httpDone
		enter(drainHooks)
		a.runHooks(drainCtx)
	}()
	select {
	case <-done:
	case <-drainCtx.Done():
		cutOff := drainWork
		if s := step.Load(); s != nil {
			cutOff = *s
		}
		a.log.Error("drain timeout exceeded", "timeout", drainTimeout.String(), "cut_off", cutOff)
		// Shutdown does not end the requests still running: cut their
		// connections, which ends their contexts, so that they return
		// their database connections and the drain above goes on to the
		// shutdown hooks instead of leaving them (and the pools) open for
		// as long as such a request runs.
		_ = a.httpSrv.Close()
		a.state.Store(StateStopped)
		drainErr := fmt.Errorf("%w after %s: %s", ErrDrainTimeout, drainTimeout, cutOff)
		if runErr != nil {
			// The failure that stopped the process is why it drained:
			// keep it, first, rather than only in the log.
			return fmt.Errorf("%w; then %w", runErr, drainErr)
		}
		return drainErr
	}
	a.state.Store(StateStopped)
	a.log.Info("process stopped")
	return runErr
}

// logTenantRole logs an ERROR at boot when the database user may not
// switch to kumiko_tenant (see checkTenantRole): the process still starts
// (readiness reports the problem), but the cause is in the log at once
// rather than hidden behind failing requests. An unreachable database is
// left to the readiness checks.
func (a *App) logTenantRole(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	if err := a.checkTenantRole(ctx); errors.Is(err, errNoTenantRole) {
		a.log.Error("database misconfigured: tenant-scoped transactions will fail", "error", err)
	}
}

// watchEventLog checks every logCheck that the event log's commit keys
// are below the server's transaction ids (eventstore.CheckCommitKeys,
// noted by noteEventLog). Serve has checked once before anything could
// write; until a check has answered, writes stay paused and the check is
// retried every uncheckedRetry. A check that does not answer later (an
// unreachable database) changes nothing.
func (a *App) watchEventLog(ctx context.Context) {
	for {
		interval := a.logCheck
		if errors.Is(a.rt.WritesBlocked(), errEventLogUnchecked) {
			interval = min(interval, uncheckedRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		cctx, cancel := context.WithTimeout(ctx, readyBudget)
		a.noteEventLog(eventstore.CheckCommitKeys(cctx, a.pool))
		cancel()
	}
}

// errEventLogUnchecked is the reason writes are paused from boot until a
// check of the event log has answered.
var errEventLogUnchecked = errors.New("entrypoint: the event log's commit keys are not checked yet (is the database reachable?)")

// uncheckedRetry is how often watchEventLog checks while no check has
// answered yet.
const uncheckedRetry = time.Second

// noteEventLog pauses or resumes writes after a check of the event log
// (watchEventLog's, or the readiness check event_log). While the log's
// commit keys are ahead of the server's transaction ids (a dump restored
// into a new cluster), no event is delivered, and an event appended would
// sort behind the consumers' cursors and never be delivered: writes are
// paused (framework.Runtime.BlockWrites: 503 unavailable) and an ERROR is
// logged once; once the operator's repair is in place, writes resume. A
// check that did not answer (err neither nil nor the log's) changes
// nothing: paused before the first answer, writes stay paused.
func (a *App) noteEventLog(err error) {
	var ahead *eventstore.CommitKeyAheadError
	isAhead := errors.As(err, &ahead)
	if !isAhead && err != nil {
		return
	}
	a.logMu.Lock()
	defer a.logMu.Unlock()
	prev := a.rt.WritesBlocked()
	var wasAhead *eventstore.CommitKeyAheadError
	switch {
	case isAhead:
		if !errors.As(prev, &wasAhead) {
			a.log.Error("event log ahead of transaction ids: no event will be delivered; writes paused", "error", err)
		}
		a.rt.BlockWrites(err)
	case prev != nil:
		a.rt.BlockWrites(nil)
		if errors.As(prev, &wasAhead) {
			a.log.Info("event log repaired: writes resumed")
		}
	}
}

// primeHub positions the SSE hub, retrying while the database is
// unreachable; it reports false when ctx ended or the hub closed first.
func (a *App) primeHub(ctx context.Context) bool {
	prime := func(ctx context.Context) error { return a.hub.Prime(ctx, a.instanceID) }
	return retry.Until(ctx, prime, func(err error, retryIn time.Duration) bool {
		if errors.Is(err, sse.ErrClosed) {
			return false
		}
		a.log.Warn("sse prime failed", "error", err, "retry_in", retryIn.String())
		return true
	})
}

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "kumiko-" + hex.EncodeToString(b)
}

// migrationInterval is how often a process whose migrations are pending
// checks them again.
const migrationInterval = time.Second

// migrationGate holds the consumers and job handlers of a process back
// until every migration of its set is applied: a release's projections and
// jobs may need its tables and columns, and run against the schema before
// its migrations every pass fails, counts an attempt, and a projection ends
// dead (and stays dead after the migration) within its MaxAttempts. Code on
// a schema newer than its own is not held: it knows none of the newer
// migrations.
type migrationGate struct {
	once sync.Once
	done chan struct{}
}

func (g *migrationGate) ch() chan struct{} {
	g.once.Do(func() { g.done = make(chan struct{}) })
	return g.done
}

// run checks the migrations until they are all applied, logging a warning
// that names the pending one (once, and again when another is pending),
// then opens the gate. A check that fails for another reason (the
// database unreachable, the check timing out) is logged as such: running
// kumiko migrate would not help then.
func (g *migrationGate) run(ctx context.Context, pool *pgxpool.Pool, set fs.FS, log *slog.Logger) {
	var warned string
	for {
		cctx, cancel := context.WithTimeout(ctx, readyBudget)
		err := migrate.Check(cctx, pool, set)
		cancel()
		if err == nil {
			if warned != "" {
				log.Info("migrations applied: consumers and jobs start")
			}
			close(g.ch())
			return
		}
		if msg := err.Error(); msg != warned && ctx.Err() == nil {
			if errors.Is(err, migrate.ErrPending) {
				log.Warn("consumers and jobs wait for the migrations: run kumiko migrate", "error", msg)
			} else {
				log.Warn("consumers and jobs wait: the migrations could not be checked (is the database reachable?)", "error", msg)
			}
			warned = msg
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(migrationInterval):
		}
	}
}

// wait blocks until the gate opens (true) or ctx ends (false).
func (g *migrationGate) wait(ctx context.Context) bool {
	select {
	case <-g.ch():
		return true
	case <-ctx.Done():
		return false
	}
}
