package entrypoint

// The jobs part of a process (framework/jobs): boot validation, the asynq
// lanes each mode consumes, the job-trigger consumer, the cron scheduler
// and the admin API for archived runs. app.go calls in at four marked
// places: validateJobs after the registry is built, setupJobs where the
// dispatcher's consumers are chosen, mountJobsAdmin where the API's routes
// are added, runJobs when the process starts.
//
//	mode        lanes consumed                 scheduler  job-trigger consumer
//	api         api, only with RunLocalJobs    no         no (enqueues via the log)
//	worker      worker                         yes        yes
//	all-in-one  api and worker                 yes        yes

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/web"
)

// jobsAdminRole is the role the jobs admin API requires.
const jobsAdminRole = "admin"

// appJobs is the process's jobs part.
type appJobs struct {
	runner *jobs.Runner
}

// Jobs returns the process's job runner (nil when no job is declared): its
// Client dispatches manual jobs, its Inspector lists and retries runs.
func (a *App) Jobs() *jobs.Runner {
	if a.jobs == nil {
		return nil
	}
	return a.jobs.runner
}

// validateJobs checks the declared jobs against this process: they need
// Redis, and an api process needs RunLocalJobs when jobs run in the api
// lane. The error names the jobs.
func (a *App) validateJobs() error {
	err := jobs.Validate(jobs.For(a.reg), jobs.Topology{
		RedisConfigured: a.cfg.RedisURL != "",
		APIProcess:      a.mode == config.ModeAPI,
		RunLocalJobs:    a.cfg.RunLocalJobs,
	})
	if err != nil {
		return fmt.Errorf("entrypoint: %w", err)
	}
	return nil
}

// reservedConnections is how many connections of DATABASE_POOL_MAX job
// runs leave to the rest of the process (jobs.Config.MaxTransactions).
const reservedConnections = 2

// setupJobs builds the job runner of this mode on its own Redis client and
// returns consumers with the job-trigger consumer added where the mode runs
// it (worker and all-in-one). Without declared jobs it changes nothing.
func (a *App) setupJobs(consumers []dispatcher.Consumer) ([]dispatcher.Consumer, error) {
	if jobs.For(a.reg).Len() == 0 {
		return consumers, nil
	}
	ro, err := a.cfg.RedisOptions()
	if err != nil {
		return nil, fmt.Errorf("entrypoint: jobs: %w", err)
	}
	// A client of its own: a lane's workers hold connections while they
	// run, which must not starve idempotency and cache lookups.
	rdb := redis.NewClient(ro)
	a.onShutdown(func(context.Context) error { return rdb.Close() })
	// A lane runs KUMIKO_JOBS_CONCURRENCY runs at once (0, a Config built in
	// code, is the runner's default). A run's transaction holds a
	// connection of the pool this process's dispatcher, requests and
	// health checks use too: the runs of the lanes may hold all but two of
	// them, however many run at once.
	cfg := &jobs.Config{Logger: a.log, Metrics: a.metrics, Concurrency: a.cfg.JobsConcurrency,
		MaxTransactions: max(1, int(a.cfg.DatabasePoolMax)-reservedConnections)}
	switch a.mode {
	case config.ModeAPI:
		if a.cfg.RunLocalJobs {
			cfg.Lanes = []framework.RunIn{framework.RunInAPI}
		}
	case config.ModeWorker:
		cfg.Lanes = []framework.RunIn{framework.RunInWorker}
		cfg.Scheduler = true
	default:
		cfg.Lanes = jobs.Lanes
		cfg.Scheduler = true
	}
	runner, err := jobs.New(a.rt, rdb, cfg)
	if err != nil {
		return nil, fmt.Errorf("entrypoint: %w", err)
	}
	a.jobs = &appJobs{runner: runner}
	if a.mode != config.ModeAPI {
		consumers = append(consumers, runner.Consumer())
	}
	return consumers, nil
}

// runJobs starts the runner on ctx as a goroutine of wg; a runner that
// cannot start reports on errc (without blocking), which stops the process.
// New mounted the jobs admin API (api and all-in-one).
func (a *App) runJobs(ctx context.Context, wg *sync.WaitGroup, errc chan<- error) {
	if a.jobs == nil {
		return
	}
	wg.Go(func() {
		if !a.migrated.wait(ctx) {
			return
		}
		if err := a.jobs.runner.Run(ctx); err != nil {
			select {
			case errc <- err:
			default:
				a.log.Error("jobs runner failed", "error", err)
			}
		}
	})
}

// mountJobsAdmin adds the admin API for runs, for callers with the admin
// role, scoped to the caller's tenant (another tenant's runs are invisible
// and answer 404; cron runs belong to the system tenant and are managed with
// `kumiko jobs`):
//
//   - GET /api/admin/jobs?state=archived&lane=worker&limit=50 lists runs.
//   - POST /api/admin/jobs/:lane/:id/retry runs an archived run again.
func (a *App) mountJobsAdmin(s *web.Server) {
	e := s.Echo()
	in := a.jobs.runner.Inspector()
	e.GET("/api/admin/jobs", func(c echo.Context) error {
		p, err := requireJobsAdmin(c)
		if err != nil {
			return err
		}
		q := map[string]string{}
		for _, name := range []string{"state", "lane", "limit"} {
			if q[name], err = web.SelectorParam(c, name); err != nil {
				return err
			}
		}
		opts := &jobs.ListOptions{State: jobs.State(q["state"]), Lane: framework.RunIn(q["lane"]), TenantID: p.TenantID}
		var fields []framework.FieldError
		if opts.State != "" && !validState(opts.State) {
			fields = append(fields, framework.FieldError{Field: "state", Rule: "oneof", Message: "state must be one of archived, pending, active, scheduled, retry, completed"})
		}
		if opts.Lane != "" && opts.Lane != framework.RunInAPI && opts.Lane != framework.RunInWorker {
			fields = append(fields, framework.FieldError{Field: "lane", Rule: "oneof", Message: "lane must be api or worker"})
		}
		if l := q["limit"]; l != "" {
			n, err := strconv.Atoi(l)
			if err != nil || n < 1 || n > 1000 {
				fields = append(fields, framework.FieldError{Field: "limit", Rule: "range", Message: "limit must be an integer between 1 and 1000"})
			}
			opts.Limit = n
		}
		if len(fields) > 0 {
			return &framework.ValidationError{Fields: fields}
		}
		items, err := in.List(c.Request().Context(), opts)
		if err != nil {
			return &framework.Error{Code: framework.CodeUnavailable, Message: "job queues unavailable", Err: err}
		}
		return c.JSON(http.StatusOK, map[string]any{"data": map[string]any{"items": items}})
	}, s.Authenticate)
	e.POST("/api/admin/jobs/:lane/:id/retry", func(c echo.Context) error {
		p, err := requireJobsAdmin(c)
		if err != nil {
			return err
		}
		// Clients escape the id's ':' and '@'; echo then hands out every
		// parameter of the raw path still escaped.
		rawLane, err := web.PathParam(c, "lane")
		if err != nil {
			return err
		}
		id, err := web.PathParam(c, "id")
		if err != nil {
			return err
		}
		lane := framework.RunIn(rawLane)
		if lane != framework.RunInAPI && lane != framework.RunInWorker {
			return &framework.ValidationError{Fields: []framework.FieldError{{Field: "lane", Rule: "oneof", Message: "lane must be api or worker"}}}
		}
		ctx := c.Request().Context()
		t, err := in.Get(ctx, lane, id)
		switch {
		case errors.Is(err, jobs.ErrTaskNotFound) || (err == nil && t.TenantID != p.TenantID):
			return framework.Errorf(framework.CodeNotFound, "no job run %s in the %s lane", framework.Excerpt(id), lane)
		case err != nil:
			return &framework.Error{Code: framework.CodeUnavailable, Message: "job queues unavailable", Err: err}
		}
		t, err = in.Retry(ctx, lane, id)
		switch {
		case errors.Is(err, jobs.ErrNotRetryable):
			return &framework.Error{Code: framework.CodeConflict, Message: fmt.Sprintf("job run %s is %s; only archived, retry and scheduled runs can be retried", id, t.State), Err: err}
		case errors.Is(err, jobs.ErrDuplicate):
			return &framework.Error{Code: framework.CodeConflict, Message: fmt.Sprintf("job run %s is not retried: an equal run holds its Unique window", id), Err: err}
		case errors.Is(err, jobs.ErrTaskNotFound):
			return framework.Errorf(framework.CodeNotFound, "no job run %s in the %s lane", framework.Excerpt(id), lane)
		case err != nil:
			return &framework.Error{Code: framework.CodeUnavailable, Message: "job queues unavailable", Err: err}
		}
		return c.JSON(http.StatusOK, map[string]any{"data": map[string]any{"id": t.ID, "job": t.Job, "lane": t.Lane, "state": jobs.StatePending}})
	}, s.Authenticate)
}

// requireJobsAdmin returns the caller, or access_denied without the admin
// role.
func requireJobsAdmin(c echo.Context) (framework.Principal, error) {
	p, ok := web.PrincipalFrom(c)
	if !ok || !p.HasAllRoles([]string{jobsAdminRole}) {
		return p, &framework.Error{Code: framework.CodeAccessDenied, Message: "the jobs admin API requires the admin role"}
	}
	return p, nil
}

func validState(s jobs.State) bool {
	for _, st := range jobs.States {
		if st == s {
			return true
		}
	}
	return false
}
