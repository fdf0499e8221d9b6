package entrypoint

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// readyBudget bounds the whole readiness answer.
const readyBudget = 1500 * time.Millisecond

// Check is one readiness check's outcome.
type Check struct {
	// Name is what was checked ("database", "redis", ...).
	Name string `json:"name"`
	// OK reports whether it answered in time.
	OK bool `json:"ok"`
	// LatencyMs is how long it took to answer, in milliseconds.
	LatencyMs int64 `json:"latencyMs"`
	// Error is why it failed, when it did.
	Error string `json:"error,omitempty"`
}

// Readiness is the body of /health/ready.
type Readiness struct {
	// Status is "ok", or "unavailable" when a check failed or the process
	// is not (or no longer) ready.
	Status string `json:"status"`
	// State is the process's lifecycle state (starting, ready, draining, stopped).
	State State `json:"state"`
	// Checks are the dependency checks behind Status.
	Checks []Check `json:"checks"`
}

// probeMethods are the methods the health and metrics routes answer:
// uptime monitors and load balancers often probe with HEAD, which gets
// GET's status and headers without the body.
var probeMethods = []string{http.MethodGet, http.MethodHead}

// mountHealth adds /health/live, /health/ready and /metrics.
func (a *App) mountHealth(e *echo.Echo) {
	e.Match(probeMethods, "/health/live", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]any{"status": "ok", "state": a.State()})
	})
	e.Match(probeMethods, "/health/ready", func(c echo.Context) error {
		r := a.Ready(c.Request().Context())
		code := http.StatusOK
		if r.Status != "ok" {
			code = http.StatusServiceUnavailable
		}
		return c.JSON(code, r)
	})
	e.Match(probeMethods, "/metrics", echo.WrapHandler(promhttp.HandlerFor(a.metrics, promhttp.HandlerOpts{})))
}

// Ready runs the readiness checks concurrently, each bounded, so the answer
// comes within the 2 s budget. A call made while another's checks run shares
// their outcome instead of running its own: the probe route needs no token,
// and a burst of probes would otherwise take four of the pool's connections
// each, starving writes and failing its own checks on the pool.
func (a *App) Ready(ctx context.Context) Readiness {
	r := Readiness{Status: "ok", State: a.State(), Checks: a.sharedChecks(ctx)}
	if r.State != StateReady {
		r.Status = "unavailable"
	}
	for _, c := range r.Checks {
		if !c.OK {
			r.Status = "unavailable"
		}
	}
	return r
}

// readyRun is one run of the readiness checks; done closes when checks
// holds its outcome.
type readyRun struct {
	done   chan struct{}
	checks []Check
}

// sharedChecks returns the outcome of the run of the checks in progress,
// or starts one when none is. The run is bounded by readyBudget and does not
// end with the context of the call that started it (a probe that hangs up
// fails no other); a waiting call returns early only when its own context
// ends, with every check failed by that.
func (a *App) sharedChecks(ctx context.Context) []Check {
	a.readyMu.Lock()
	run := a.readyRun
	owner := run == nil
	if owner {
		run = &readyRun{done: make(chan struct{})}
		a.readyRun = run
	}
	a.readyMu.Unlock()
	if owner {
		func() {
			// Deferred: whatever ends the run, later probes start their own.
			defer func() {
				a.readyMu.Lock()
				a.readyRun = nil
				a.readyMu.Unlock()
				close(run.done)
			}()
			run.checks = a.runChecks(context.WithoutCancel(ctx))
		}()
	}
	select {
	case <-run.done:
		return slices.Clone(run.checks)
	case <-ctx.Done():
		return []Check{{Name: "probe", Error: ctx.Err().Error()}}
	}
}

// runChecks runs the readiness checks concurrently within readyBudget.
func (a *App) runChecks(ctx context.Context) []Check {
	ctx, cancel := context.WithTimeout(ctx, readyBudget)
	defer cancel()
	type check struct {
		name string
		fn   func(context.Context) error
	}
	checks := []check{
		{"database", func(ctx context.Context) error { return a.pool.Ping(ctx) }},
		{"redis", func(ctx context.Context) error { return a.redis.Ping(ctx).Err() }},
		{"migrations", func(ctx context.Context) error { return migrate.Check(ctx, a.pool, a.migrations) }},
		{"tenant_role", a.checkTenantRole},
		{"event_log", func(ctx context.Context) error {
			// The answer also pauses or resumes writes (see noteEventLog).
			err := eventstore.CheckCommitKeys(ctx, a.pool)
			a.noteEventLog(err)
			return err
		}},
	}
	if a.hub != nil {
		checks = append(checks, check{"sse", func(context.Context) error {
			if !a.hub.Ready() {
				return errors.New("the live stream is not positioned yet (database unreachable at start?)")
			}
			return nil
		}})
	}
	if a.disp != nil {
		checks = append(checks, check{"consumers", func(context.Context) error {
			if !a.disp.Registered() {
				return errors.New("the dispatcher has not registered its consumers yet")
			}
			return nil
		}})
		if a.maxLag > 0 {
			checks = append(checks, check{"consumer_lag", a.checkLag})
		}
	}
	out := make([]Check, len(checks))
	var wg sync.WaitGroup
	for i, ch := range checks {
		wg.Go(func() {
			start := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- ch.fn(ctx) }()
			var err error
			select {
			case err = <-errc:
			case <-ctx.Done():
				err = ctx.Err()
			}
			out[i] = Check{Name: ch.name, OK: err == nil, LatencyMs: time.Since(start).Milliseconds()}
			if err != nil {
				out[i].Error = err.Error()
			}
		})
	}
	wg.Wait()
	return out
}

// errNoTenantRole is the failure of checkTenantRole for a user that is no
// member of kumiko_tenant.
var errNoTenantRole = errors.New("the database user may not SET ROLE " + tenancy.Role)

// checkTenantRole fails when the pool's database user may not switch to
// kumiko_tenant (not a member, and no superuser): every tenant-scoped
// transaction would then fail at its SET ROLE. One cheap catalog query.
func (a *App) checkTenantRole(ctx context.Context) error {
	var user string
	var member bool
	err := a.pool.QueryRow(ctx, `SELECT quote_ident(current_user), pg_has_role(current_user, $1, 'MEMBER')`, tenancy.Role).Scan(&user, &member)
	if err != nil {
		return err
	}
	if !member {
		return fmt.Errorf("%w: %s is not a member of it, so every tenant-scoped write and query fails; have the role's owner or a superuser run GRANT %s TO %s",
			errNoTenantRole, user, tenancy.Role, user)
	}
	return nil
}

// lagSQL counts, per consumer of this process, the events after its cursor
// (of its types), stopping at limit.
const lagSQL = `SELECT c.name, (SELECT count(*) FROM (
    SELECT 1 FROM events e
    WHERE (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
      AND (c.event_types IS NULL OR e.type = ANY(c.event_types))
      AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index)
    LIMIT $3) x)
FROM event_consumers c
WHERE c.name = ANY($1) AND c.instance_id IN ('__shared__', $2) AND c.status <> 'disabled'`

// checkLag fails when a consumer of this process lags more than ReadyMaxLag
// events behind the log.
func (a *App) checkLag(ctx context.Context) error {
	rows, err := a.pool.Query(ctx, lagSQL, a.disp.Consumers(), a.instanceID, a.maxLag+1)
	if err != nil {
		return err
	}
	defer rows.Close()
	var behind []string
	for rows.Next() {
		var name string
		var lag int64
		if err := rows.Scan(&name, &lag); err != nil {
			return err
		}
		if lag > a.maxLag {
			behind = append(behind, fmt.Sprintf("%s lags more than %d events", name, a.maxLag))
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(behind) > 0 {
		return errors.New(strings.Join(behind, "; "))
	}
	return nil
}
