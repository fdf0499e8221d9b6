package admin

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/web"
)

// Role is the role a token needs for every /api/admin route.
const Role = "admin"

// maxBody bounds an ops request's JSON body.
const maxBody = 16 << 10

//go:embed page.html page.js
var pageFS embed.FS

// Mount registers the admin API and page on e. Every /api/admin route runs
// authenticate (a missing or bad token is a 401) and then requires the
// [Role] role (403 access_denied without it):
//
//   - GET /api/admin/consumers: every consumer state row.
//   - GET /api/admin/consumers/:name[?instance=ID]: one row with its newest
//     dead letters.
//   - POST /api/admin/consumers/:name/restart|skip|disable|enable|rewind: the
//     ops verbs of package dispatcher. The instance id comes from
//     ?instance=ID or the body's "instance" field (default: the shared
//     row); rewind's body names {"toPosition": N} or {"toTime": RFC 3339},
//     which the other verbs refuse.
//   - DELETE /api/admin/instances/:instance: removes a silent instance's
//     per-instance rows at once.
//
// Answers are {"data": ...}; failures are Kumiko's error envelope: an
// unknown consumer or event is 404 not_found, a verb refused in the
// consumer's state 409 conflict, bad input 400. GET /admin (and
// /admin/app.js) serve a static page without authentication that polls
// the list every 2 seconds with the token from its URL fragment
// (#token=...), its ?token= query parameter, or the kumiko_auth cookie.
// [MountMaintenance] adds the migrate, prune (events, HandledOnce claims,
// dead letters) and rebuild verbs.
func Mount(e *echo.Echo, authenticate echo.MiddlewareFunc, pool *pgxpool.Pool) {
	if e == nil || authenticate == nil || pool == nil {
		panic("kumiko: admin.Mount: nil echo, authenticate or pool")
	}
	h := &handlers{pool: pool}
	mw := []echo.MiddlewareFunc{authenticate, requireAdmin}
	e.GET("/api/admin/consumers", h.list, mw...)
	e.GET("/api/admin/consumers/:name", h.status, mw...)
	e.POST("/api/admin/consumers/:name/restart", h.verb(noTarget("restart", func(c echo.Context, name, instance string, _ *opsBody) (map[string]any, error) {
		return nil, dispatcher.Restart(c.Request().Context(), pool, name, instance)
	})), mw...)
	e.POST("/api/admin/consumers/:name/skip", h.verb(noTarget("skip", func(c echo.Context, name, instance string, _ *opsBody) (map[string]any, error) {
		dl, err := dispatcher.Skip(c.Request().Context(), pool, name, instance)
		return map[string]any{"skipped": dl}, err
	})), mw...)
	e.POST("/api/admin/consumers/:name/disable", h.verb(noTarget("disable", func(c echo.Context, name, instance string, _ *opsBody) (map[string]any, error) {
		return nil, dispatcher.Disable(c.Request().Context(), pool, name, instance)
	})), mw...)
	e.POST("/api/admin/consumers/:name/enable", h.verb(noTarget("enable", func(c echo.Context, name, instance string, _ *opsBody) (map[string]any, error) {
		return nil, dispatcher.Enable(c.Request().Context(), pool, name, instance)
	})), mw...)
	e.POST("/api/admin/consumers/:name/rewind", h.verb(h.rewind), mw...)
	e.DELETE("/api/admin/instances/:instance", h.removeInstance, mw...)
	e.GET("/admin", servePage("page.html", "text/html; charset=utf-8"))
	e.GET("/admin/app.js", servePage("page.js", "text/javascript; charset=utf-8"))
}

// requireAdmin answers 403 unless the authenticated caller has [Role].
func requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if p, ok := web.PrincipalFrom(c); !ok || !p.HasRole(Role) {
			return web.WriteError(c, &framework.Error{Code: framework.CodeAccessDenied,
				Message: "the " + Role + " role is required"})
		}
		return next(c)
	}
}

type handlers struct {
	pool *pgxpool.Pool
}

// opsBody is the optional JSON body of a verb.
type opsBody struct {
	Instance   *string `json:"instance"`
	ToPosition *int64  `json:"toPosition"`
	ToTime     *string `json:"toTime"`
}

func (h *handlers) list(c echo.Context) error {
	rows, err := dispatcher.List(c.Request().Context(), h.pool)
	if err != nil {
		return web.WriteError(c, err)
	}
	if rows == nil {
		rows = []dispatcher.ConsumerStatus{}
	}
	return writeData(c, rows)
}

func (h *handlers) status(c echo.Context) error {
	name, err := pathParam(c, "name")
	if err != nil {
		return web.WriteError(c, err)
	}
	instance, err := web.SelectorParam(c, "instance")
	if err != nil {
		return web.WriteError(c, err)
	}
	st, err := dispatcher.Status(c.Request().Context(), h.pool, name, instance)
	if err != nil {
		return web.WriteError(c, toError(err))
	}
	return writeData(c, st)
}

// verbFunc runs an ops verb on a consumer's row and returns what its
// answer adds beside the consumer's status.
type verbFunc func(c echo.Context, name, instance string, body *opsBody) (map[string]any, error)

// noTarget refuses a rewind target (toPosition, toTime) in the body of a
// verb that heeds none: skip {"toPosition": N} must not skip the failing
// event as if it moved to N.
func noTarget(verb string, fn verbFunc) verbFunc {
	return func(c echo.Context, name, instance string, body *opsBody) (map[string]any, error) {
		switch {
		case body.ToPosition != nil:
			return nil, invalid("toPosition", "excluded", verb+" takes no toPosition: only rewind moves the cursor")
		case body.ToTime != nil:
			return nil, invalid("toTime", "excluded", verb+" takes no toTime: only rewind moves the cursor")
		}
		return fn(c, name, instance, body)
	}
}

// verb wraps an ops verb: it reads the name, the body and the instance,
// runs fn, and answers {"data": {"consumer": <status after>, ...extra}}.
func (h *handlers) verb(fn verbFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		name, err := pathParam(c, "name")
		if err != nil {
			return web.WriteError(c, err)
		}
		body, err := readBody(c)
		if err != nil {
			return web.WriteError(c, err)
		}
		instance, err := web.SelectorParam(c, "instance")
		if err != nil {
			return web.WriteError(c, err)
		}
		if body.Instance != nil {
			if err := web.RefuseBlank("instance", *body.Instance); err != nil {
				return web.WriteError(c, err)
			}
			if instance != "" && instance != *body.Instance {
				return web.WriteError(c, invalid("instance", "eqfield", "instance differs between the query (?instance=) and the body"))
			}
			instance = *body.Instance
		}
		extra, err := fn(c, name, instance, body)
		if err != nil {
			return web.WriteError(c, toError(err))
		}
		st, err := dispatcher.Status(c.Request().Context(), h.pool, name, instance)
		if err != nil {
			return web.WriteError(c, toError(err))
		}
		out := map[string]any{"consumer": st}
		for k, v := range extra {
			out[k] = v
		}
		return writeData(c, out)
	}
}

// rewind validates the target and runs dispatcher.Rewind.
func (h *handlers) rewind(c echo.Context, name, instance string, body *opsBody) (map[string]any, error) {
	var to dispatcher.RewindTo
	switch {
	case body.ToPosition != nil && body.ToTime != nil:
		return nil, invalid("toPosition", "excluded_with", "set toPosition or toTime, not both")
	case body.ToPosition != nil:
		if *body.ToPosition < 0 {
			return nil, invalid("toPosition", "min", "toPosition must be 0 (the start of the log) or an event's position")
		}
		to.Position = *body.ToPosition
	case body.ToTime != nil:
		t, err := time.Parse(time.RFC3339Nano, *body.ToTime)
		if err != nil {
			return nil, invalid("toTime", "datetime", "toTime must be an RFC 3339 time, e.g. 2026-05-01T12:00:00Z")
		}
		if t.IsZero() {
			return nil, invalid("toTime", "datetime", "toTime must not be the zero time")
		}
		to.Time = t
	default:
		return nil, invalid("toPosition", "required_without", "rewind needs toPosition (0 for the start of the log) or toTime")
	}
	res, err := dispatcher.Rewind(c.Request().Context(), h.pool, name, instance, to)
	if err != nil {
		return nil, err
	}
	return map[string]any{"rewound": map[string]any{
		"from": res.From.String(), "fromPosition": res.From.Position,
		"to": res.To.String(), "toPosition": res.To.Position,
	}}, nil
}

func (h *handlers) removeInstance(c echo.Context) error {
	instance, err := pathParam(c, "instance")
	if err != nil {
		return web.WriteError(c, err)
	}
	n, err := dispatcher.RemoveInstance(c.Request().Context(), h.pool, instance)
	if err != nil {
		return web.WriteError(c, toError(err))
	}
	return writeData(c, map[string]any{"instance": instance, "removed": n})
}

// toError maps the dispatcher's ops errors to Kumiko's error codes; other
// errors stay internal.
func toError(err error) error {
	var se *dispatcher.StateError
	switch {
	case errors.Is(err, dispatcher.ErrSharedInstance):
		return invalid("instance", "ne", err.Error())
	case errors.As(err, &se):
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(), Err: err, Details: map[string]any{
			"name": se.Name, "instance": se.Instance, "verb": se.Verb, "status": se.Status, "want": se.Want,
		}}
	case errors.Is(err, dispatcher.ErrConsumerNotFound), errors.Is(err, dispatcher.ErrEventNotFound):
		return &framework.Error{Code: framework.CodeNotFound, Message: err.Error(), Err: err}
	case errors.Is(err, dispatcher.ErrNothingToSkip), errors.Is(err, dispatcher.ErrRewindForward),
		errors.Is(err, dispatcher.ErrConsumerBusy), errors.Is(err, dispatcher.ErrInstanceAlive),
		errors.Is(err, dispatcher.ErrRebuildConsumer), errors.Is(err, dispatcher.ErrLiveStreamConsumer):
		return &framework.Error{Code: framework.CodeConflict, Message: err.Error(), Err: err}
	}
	return err
}

// invalid is a validation_error naming one field.
func invalid(field, rule, msg string) error {
	return &framework.ValidationError{Fields: []framework.FieldError{{Field: field, Rule: rule, Message: msg}}}
}

// pathParam returns a path parameter, unescaped ([web.PathParam]); an
// empty or blank one (only white space: no consumer, projection or
// instance is named so) is a validation_error.
func pathParam(c echo.Context, name string) (string, error) {
	v, err := web.PathParam(c, name)
	if err != nil {
		return "", err
	}
	if strings.TrimSpace(v) == "" {
		return "", invalid(name, "required", name+" is required")
	}
	return v, nil
}

// readBody decodes the optional JSON body of a verb; an empty body is no
// options.
func readBody(c echo.Context) (*opsBody, error) {
	var b opsBody
	if err := decodeBody(c, &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// decodeBody decodes the request's JSON object body into v as the core
// API decodes its bodies ([web.DecodeJSON]: unknown fields and trailing
// data refused, a value of the wrong kind named by its JSON path and
// kind); an empty body leaves v unchanged.
func decodeBody(c echo.Context, v any) error {
	raw, err := io.ReadAll(http.MaxBytesReader(c.Response().Writer, c.Request().Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &framework.Error{Code: framework.CodePayloadTooLarge,
				Message: fmt.Sprintf("request body exceeds the limit of %d bytes", maxBody), Err: err}
		}
		return &framework.Error{Code: framework.CodeBadRequest, Message: "cannot read the request body", Err: err}
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	return web.DecodeJSON(raw, web.DefaultMaxJSONDepth, v)
}

// writeData answers 200 {"data": v}, encoding before writing anything.
func writeData(c echo.Context, v any) error {
	b, err := json.Marshal(map[string]any{"data": v})
	if err != nil {
		return web.WriteError(c, fmt.Errorf("admin: encode response: %w", err))
	}
	return c.JSONBlob(http.StatusOK, b)
}

// servePage serves an embedded file with headers that keep the page's
// token out of referrers and forbid other origins from framing it.
func servePage(file, contentType string) echo.HandlerFunc {
	body, err := pageFS.ReadFile(file)
	if err != nil {
		panic("kumiko: admin: embedded " + file + " missing")
	}
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Cache-Control", "no-store")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		return c.Blob(http.StatusOK, contentType, body)
	}
}
