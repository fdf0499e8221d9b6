package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/framework/rebuild"
	"github.com/kumiko-go/kumiko/framework/retention"
	"github.com/kumiko-go/kumiko/framework/web"
)

// MountMaintenance registers the maintenance verbs of the `kumiko
// migrate`, `kumiko events prune`, `kumiko jobs prune-handled`, `kumiko
// consumer prune-dead-letters` and `kumiko projection rebuild` commands on
// e, with the same authentication and [Role] requirement as [Mount]:
//
//   - GET /api/admin/migrations: every embedded migration with its state.
//   - POST /api/admin/migrations/up: applies the pending migrations under
//     goose's advisory lock and answers those it applied. While another
//     migrator holds the lock it waits, and logs that it does on the
//     server's logger (with the holder's backend pid), as `kumiko migrate`
//     does. A client that goes away stops the running migration, which
//     stays pending.
//   - POST /api/admin/events/prune: body {"olderThanDays": N, "types":
//     [...], "dryRun": bool}; answers the prune's result (package
//     retention).
//   - POST /api/admin/jobs/handled/prune: body {"olderThanDays": N};
//     deletes the HandledOnce claims of every tenant made more than N days
//     ago ([jobs.PruneHandled]) and answers {"olderThanDays": N,
//     "deleted": count}.
//   - POST /api/admin/dead-letters/prune: body {"olderThanDays": N};
//     deletes the dead letters of every consumer and instance recorded more
//     than N days ago ([retention.PruneDeadLetters]) and answers
//     {"olderThanDays": N, "deleted": count}.
//   - POST /api/admin/projections/:name/rebuild: optional body
//     {"batchSize": N} or {"abandon": true}; runs the rebuild (package
//     rebuild) in the request and answers its result. A client that goes
//     away cancels it, and the rebuild removes what it built.
//
// reg is the application's built registry (the event types a prune may
// name, the projections a rebuild may replay); migrations is its migration
// set (nil: Kumiko's embedded migrations), as given to the process.
func MountMaintenance(e *echo.Echo, authenticate echo.MiddlewareFunc, pool *pgxpool.Pool, reg *framework.Registry, migrations fs.FS) {
	if e == nil || authenticate == nil || pool == nil || reg == nil {
		panic("kumiko: admin.MountMaintenance: nil echo, authenticate, pool or registry")
	}
	h := &maintenance{pool: pool, reg: reg, fsys: migrations}
	mw := []echo.MiddlewareFunc{authenticate, requireAdmin}
	e.GET("/api/admin/migrations", h.migrations, mw...)
	e.POST("/api/admin/migrations/up", h.migrateUp, mw...)
	e.POST("/api/admin/events/prune", h.prune, mw...)
	e.POST("/api/admin/jobs/handled/prune", h.pruneOlder(jobs.MaxHandledAgeDays, jobs.ErrBadAge, jobs.PruneHandled), mw...)
	e.POST("/api/admin/dead-letters/prune", h.pruneOlder(retention.MaxOlderThanDays, retention.ErrBadAge, retention.PruneDeadLetters), mw...)
	e.POST("/api/admin/projections/:name/rebuild", h.rebuild, mw...)
}

type maintenance struct {
	pool *pgxpool.Pool
	reg  *framework.Registry
	fsys fs.FS // the migrations
}

// migrationJSON is one migration's state, as `kumiko migrate status`
// prints it.
type migrationJSON struct {
	Version int64  `json:"version"`
	Name    string `json:"name"`
	State   string `json:"state"`
}

func migrationsJSON(sts []migrate.Status) []migrationJSON {
	out := make([]migrationJSON, 0, len(sts))
	for _, s := range sts {
		state := "pending"
		if s.Applied {
			state = "applied"
		}
		out = append(out, migrationJSON{Version: s.Version, Name: s.Name, State: state})
	}
	return out
}

func (h *maintenance) migrations(c echo.Context) error {
	sts, err := migrate.List(c.Request().Context(), h.pool, h.fsys)
	if err != nil {
		return web.WriteError(c, err)
	}
	pending := 0
	for _, s := range sts {
		if !s.Applied {
			pending++
		}
	}
	return writeData(c, map[string]any{"migrations": migrationsJSON(sts), "pending": pending})
}

func (h *maintenance) migrateUp(c echo.Context) error {
	if err := decodeBody(c, &struct{}{}); err != nil {
		return web.WriteError(c, err)
	}
	// The server's log says when it waits for another migrator's lock, as
	// `kumiko migrate` says on stderr.
	applied, err := migrate.Apply(c.Request().Context(), h.pool, h.fsys, web.Logger(c))
	if fe, ok := errors.AsType[*migrate.FailedError](err); ok {
		// The operator's to fix, as the CLI says: which migration, why, and
		// what this run applied before it. Typed here, so that the database
		// error inside (a NOT NULL or unique violation on existing rows) is
		// not read as the client's payload's fault.
		return web.WriteError(c, &framework.Error{Code: framework.CodeConflict, Message: fe.Error(), Err: err,
			Details: map[string]any{"reason": "migration_failed", "failed": migrationsJSON([]migrate.Status{fe.Failed})[0],
				"applied": migrationsJSON(fe.Applied), "error": fe.Err.Error()}})
	}
	if err != nil {
		return web.WriteError(c, err)
	}
	return writeData(c, map[string]any{"applied": migrationsJSON(applied), "count": len(applied)})
}

// pruneBody is the JSON body of a prune. Types stays raw to tell a list
// that was left out from one given empty (or null).
type pruneBody struct {
	OlderThanDays *int            `json:"olderThanDays"`
	Types         json.RawMessage `json:"types"`
	DryRun        bool            `json:"dryRun"`
}

// pruneJSON is a prune's answer.
type pruneJSON struct {
	OlderThanDays int `json:"olderThanDays"`
	// Cutoff is RFC 3339 in UTC, formatted here: the oldest ages put it
	// before year 0, which time.Time's MarshalJSON refuses.
	Cutoff *string          `json:"cutoff"`
	Types  []string         `json:"types"`
	Counts map[string]int64 `json:"counts"`
	Total  int64            `json:"total"`
	DryRun bool             `json:"dryRun"`
}

func newPruneJSON(days int, res *retention.Result) pruneJSON {
	out := pruneJSON{OlderThanDays: days, Types: res.Types, Counts: res.Counts, Total: res.Total, DryRun: res.DryRun}
	if out.Types == nil {
		out.Types = []string{}
	}
	if out.Counts == nil {
		out.Counts = map[string]int64{}
	}
	if !res.Cutoff.IsZero() {
		t := res.Cutoff.UTC().Format(time.RFC3339Nano)
		out.Cutoff = &t
	}
	return out
}

func (h *maintenance) prune(c echo.Context) error {
	var body pruneBody
	if err := decodeBody(c, &body); err != nil {
		return web.WriteError(c, err)
	}
	if body.OlderThanDays == nil {
		return web.WriteError(c, invalid("olderThanDays", "required", "olderThanDays is required"))
	}
	if *body.OlderThanDays < 1 || *body.OlderThanDays > retention.MaxOlderThanDays {
		return web.WriteError(c, invalid("olderThanDays", "range",
			fmt.Sprintf("olderThanDays must be between 1 and %d", retention.MaxOlderThanDays)))
	}
	var names []string
	if body.Types != nil {
		var given []string
		if err := json.Unmarshal(body.Types, &given); err != nil {
			return web.WriteError(c, &framework.Error{Code: framework.CodeBadRequest,
				Message: "invalid request body: types must be a list of qualified event type names", Err: err})
		}
		for _, t := range given {
			if t = strings.TrimSpace(t); t != "" {
				names = append(names, t)
			}
		}
		if len(names) == 0 {
			// A script's empty variable must not widen the prune to every
			// pub/sub type.
			return web.WriteError(c, invalid("types", "required",
				"types names no event type; leave it out to prune every pub/sub type"))
		}
	}
	days := *body.OlderThanDays
	res, err := retention.Prune(c.Request().Context(), h.pool, h.reg, &retention.Options{
		OlderThanDays: days, Types: names, DryRun: body.DryRun,
	})
	if err != nil {
		return web.WriteError(c, pruneError(err, days, res))
	}
	return writeData(c, newPruneJSON(days, res))
}

// pruneError maps retention's refusals to Kumiko's error codes; res is the
// dry run's counts that come with a consumer-check refusal.
func pruneError(err error, days int, res *retention.Result) error {
	var lag *retention.LagError
	switch {
	case errors.As(err, &lag):
		consumers := make([]map[string]any, 0, len(lag.Consumers))
		for _, lc := range lag.Consumers {
			consumers = append(consumers, map[string]any{
				"name": lc.Name, "instance": lc.InstanceID, "status": lc.Status,
				"cursor": lc.Cursor.String(), "unseen": lc.Unseen,
			})
		}
		details := map[string]any{"reason": "consumers_behind", "consumers": consumers}
		if res != nil {
			details["dryRun"] = newPruneJSON(days, res)
		}
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(), Details: details, Err: err}
	case errors.Is(err, retention.ErrPruneRunning):
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(),
			Details: map[string]any{"reason": "prune_running"}, Err: err}
	case errors.Is(err, retention.ErrUnknownType):
		return invalid("types", "oneof", err.Error())
	case errors.Is(err, retention.ErrBadAge):
		return invalid("olderThanDays", "min", err.Error())
	}
	return err
}

// olderBody is the JSON body of a prune by age alone.
type olderBody struct {
	OlderThanDays *int `json:"olderThanDays"`
}

// olderThanDays reads and checks the olderThanDays of a prune's body,
// with the messages of the events prune.
func olderThanDays(c echo.Context, maxDays int) (int, error) {
	var body olderBody
	if err := decodeBody(c, &body); err != nil {
		return 0, err
	}
	if body.OlderThanDays == nil {
		return 0, invalid("olderThanDays", "required", "olderThanDays is required")
	}
	if d := *body.OlderThanDays; d < 1 || d > maxDays {
		return 0, invalid("olderThanDays", "range", fmt.Sprintf("olderThanDays must be between 1 and %d", maxDays))
	}
	return *body.OlderThanDays, nil
}

// pruneOlder answers a prune that deletes the rows of a table older than
// the body's olderThanDays (at most maxDays): fn deletes them and returns
// how many, or badAge for an age it refuses.
func (h *maintenance) pruneOlder(maxDays int, badAge error, fn func(context.Context, *pgxpool.Pool, int) (int64, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		days, err := olderThanDays(c, maxDays)
		if err != nil {
			return web.WriteError(c, err)
		}
		n, err := fn(c.Request().Context(), h.pool, days)
		if errors.Is(err, badAge) {
			return web.WriteError(c, invalid("olderThanDays", "range", err.Error()))
		}
		if err != nil {
			return web.WriteError(c, err)
		}
		return writeData(c, map[string]any{"olderThanDays": days, "deleted": n})
	}
}

// rebuildBody is the optional JSON body of a rebuild.
type rebuildBody struct {
	BatchSize *int `json:"batchSize"`
	Abandon   bool `json:"abandon"`
}

func (h *maintenance) rebuild(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil {
		return web.WriteError(c, err)
	}
	var body rebuildBody
	if err := decodeBody(c, &body); err != nil {
		return web.WriteError(c, err)
	}
	var batch int
	if body.BatchSize != nil {
		if body.Abandon {
			return web.WriteError(c, invalid("batchSize", "excluded_with", "abandon rebuilds nothing: leave batchSize out"))
		}
		if *body.BatchSize < 1 {
			return web.WriteError(c, invalid("batchSize", "min",
				"batchSize must be at least 1; leave it out for the projection's batch size, else 500"))
		}
		if *body.BatchSize > rebuild.MaxBatchSize {
			return web.WriteError(c, invalid("batchSize", "max",
				fmt.Sprintf("batchSize must be at most %d", rebuild.MaxBatchSize)))
		}
		batch = *body.BatchSize
	}
	// Abandon also takes a projection no longer declared, or no longer
	// rebuildable: the leftover of its killed rebuild would pin retention
	// forever.
	if _, err := rebuild.Check(h.reg, name); err != nil && !body.Abandon {
		return web.WriteError(c, rebuildError(err, name))
	}
	ctx := c.Request().Context()
	if body.Abandon {
		found, err := rebuild.Abandon(ctx, h.pool, h.reg, name)
		if err != nil {
			return web.WriteError(c, rebuildError(err, name))
		}
		return writeData(c, map[string]any{"projection": name, "removed": found})
	}
	res, err := rebuild.Rebuild(ctx, h.pool, h.reg, name, &rebuild.Config{BatchSize: batch})
	if err != nil {
		return web.WriteError(c, rebuildError(err, name))
	}
	return writeData(c, map[string]any{
		"projection": res.Projection, "table": res.Table, "events": res.Events,
		"cursor": res.Cursor.String(), "cursorPosition": res.Cursor.Position,
		"leftover": res.Leftover, "durationMs": res.Duration.Milliseconds(),
	})
}

// rebuildError maps the rebuild's refusals, and a handler that kept
// failing on an event of the replay (the operator's to fix, as the CLI
// says), to Kumiko's error codes; any other failure during the replay
// stays internal (logged with its cause).
func rebuildError(err error, name string) error {
	if ee, ok := errors.AsType[*rebuild.EventError](err); ok {
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(),
			Details: map[string]any{"projection": name, "reason": "event_failed", "position": ee.Position,
				"attempts": ee.Attempts, "error": ee.LastError}, Err: err}
	}
	switch {
	case errors.Is(err, rebuild.ErrUnknownProjection):
		// The client's name, which no projection has: an excerpt.
		return &framework.Error{Code: framework.CodeNotFound, Message: err.Error(),
			Details: map[string]any{"projection": framework.Excerpt(name)}, Err: err}
	case errors.Is(err, rebuild.ErrNotRebuildable):
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(),
			Details: map[string]any{"projection": name, "reason": "not_rebuildable"}, Err: err}
	case errors.Is(err, rebuild.ErrRunning):
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(),
			Details: map[string]any{"projection": name, "reason": "rebuild_running"}, Err: err}
	case errors.Is(err, rebuild.ErrDisabled):
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(),
			Details: map[string]any{"projection": name, "reason": "rebuild_disabled"}, Err: err}
	}
	return err
}
