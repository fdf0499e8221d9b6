package web

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/idempotency"
)

// Header names of the request and correlation ids.
const (
	HeaderRequestID     = "X-Request-ID"
	HeaderCorrelationID = "X-Correlation-ID"
)

// Defaults of [Config].
const (
	DefaultBodyLimit    int64 = 1 << 20 // 1 MiB
	DefaultMaxJSONDepth       = 64
	// MaxBatchCommands is the most commands one POST /api/batch may carry.
	MaxBatchCommands = 100
	// maxIDLength bounds a client-sent request or correlation id.
	maxIDLength = 128
)

// Keys of the values the server stores in the echo.Context.
const (
	keyServer        = "kumiko.web.server"
	keyRequestID     = "kumiko.web.request_id"
	keyCorrelationID = "kumiko.web.correlation_id"
	keyPrincipal     = "kumiko.web.principal"
	keyTokenExpiry   = "kumiko.web.token_expiry"
)

// Config tunes [New]. A nil *Config means the defaults.
type Config struct {
	// Logger receives internal errors (with request id and cause), recovered
	// panics and one line per request. Defaults to discarding.
	Logger *slog.Logger
	// BodyLimit is the largest request body in bytes the command endpoints
	// read; a larger one is answered 413 payload_too_large. Zero or negative
	// means the default. Defaults to 1 MiB.
	BodyLimit int64
	// MaxJSONDepth is the deepest nesting of objects and arrays a request
	// body may have (the body's own object counts as 1); a deeper one is
	// answered 400 bad_request before it is decoded. Zero or negative means
	// the default. Defaults to 64.
	MaxJSONDepth int
	// Idempotency makes POST /api/write and /api/batch idempotent by the
	// Idempotency-Key header or the body's requestId (see idempotency.go).
	// Defaults to nil: keys are ignored. [Server.SetIdempotency] sets it
	// later.
	Idempotency *idempotency.Store
	// Metrics registers kumiko_http_requests_total{method,route,code} and
	// kumiko_http_request_duration_seconds{method,route}, observed for
	// every request (routes added through [Server.Echo] included). New
	// panics when they cannot be registered. Defaults to none.
	Metrics prometheus.Registerer
}

// Server is Kumiko's HTTP API on echo. It holds no goroutines and needs no
// shutdown: serve [Server.Handler] with an http.Server and shut that down.
type Server struct {
	e         *echo.Echo
	rt        *framework.Runtime
	keys      *auth.Keyring
	logger    *slog.Logger
	bodyLimit int64
	maxDepth  int
	metrics   *httpMetrics
	idem      *idempotency.Store
}

// New returns a server that runs commands on rt and verifies tokens with
// keys. It registers POST /api/write, /api/batch and /api/query, all behind
// [Server.Authenticate], and installs the request-id, panic-recovery and
// error-envelope handling, and the refusal of a query string that does not
// decode, for every route, including routes added later through
// [Server.Echo]. It panics when rt or keys is nil.
func New(rt *framework.Runtime, keys *auth.Keyring, cfg *Config) *Server {
	if rt == nil {
		panic("kumiko: web.New: nil runtime")
	}
	if keys == nil {
		panic("kumiko: web.New: nil keyring")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	s := &Server{
		rt:        rt,
		keys:      keys,
		logger:    cfg.Logger,
		bodyLimit: cmp.Or(max(cfg.BodyLimit, 0), DefaultBodyLimit),
		maxDepth:  cmp.Or(max(cfg.MaxJSONDepth, 0), DefaultMaxJSONDepth),
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	m, err := newHTTPMetrics(cfg.Metrics)
	if err != nil {
		panic("kumiko: web.New: " + err.Error())
	}
	s.metrics = m
	s.idem = cfg.Idempotency
	e := s.base()
	// Route-level middleware, not a Group's: a group with middleware adds a
	// catch-all route, which turns 405s into 404s and asks unknown paths
	// for a token.
	e.POST("/api/write", s.handleWrite, s.Authenticate, s.idempotent)
	e.POST("/api/batch", s.handleBatch, s.Authenticate, s.idempotent)
	e.POST("/api/query", s.handleQuery, s.Authenticate)
	s.e = e
	return s
}

// NewBase returns an echo instance with a [Server]'s handling of every
// request and no routes: request and correlation ids (X-Request-ID,
// X-Correlation-ID), panic recovery, the error envelope (an unknown path is
// 404 not_found, a wrong method 405 method_not_allowed), the refusal of a
// query string that does not decode, one log line per request and, with
// cfg.Metrics, the HTTP metrics. Only cfg.Logger and cfg.Metrics apply. It
// serves a process that takes no commands, such as a worker's health and
// metrics port, so that it answers like the API port. It panics when the
// metrics cannot be registered.
func NewBase(cfg *Config) *echo.Echo {
	if cfg == nil {
		cfg = &Config{}
	}
	s := &Server{logger: cfg.Logger}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	m, err := newHTTPMetrics(cfg.Metrics)
	if err != nil {
		panic("kumiko: web.NewBase: " + err.Error())
	}
	s.metrics = m
	return s.base()
}

// base returns s's echo instance with the per-request handling and no
// routes.
func (s *Server) base() *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if werr := WriteError(c, err); werr != nil {
			s.logger.Warn("write error response", "request_id", RequestID(c), "error", werr)
		}
	}
	e.Pre(s.begin)
	e.Use(rejectMalformedQuery)
	return e
}

// Echo returns the echo instance, for other packages to add routes (SSE,
// admin, health). Routes added to it get the request ids, panic recovery
// and error envelope; pass [Server.Authenticate] as route middleware to
// require a token. Prefer route middleware to e.Group(prefix, mw...): such a
// group adds a catch-all route under prefix that answers 404 instead of 405
// and runs mw for unknown paths.
func (s *Server) Echo() *echo.Echo { return s.e }

// Handler returns the server as an http.Handler.
func (s *Server) Handler() http.Handler { return s.e }

// RequestID returns the request's id: the client's sane X-Request-ID, else
// a generated UUID. It returns "" outside a [Server]'s request and outside
// [NewBase]'s.
func RequestID(c echo.Context) string {
	id, _ := c.Get(keyRequestID).(string)
	return id
}

// CorrelationID returns the request's correlation id: the client's sane
// X-Correlation-ID, else the request id. It returns "" outside a [Server]'s
// request.
func CorrelationID(c echo.Context) string {
	id, _ := c.Get(keyCorrelationID).(string)
	return id
}

// CallFrom returns the [framework.Call] of an authenticated request: its
// principal, request id and correlation id (the causation id defaults to the
// request id in the runtime), the idempotency key and owner tokens of a
// claimed keyed write and the X-Kumiko-Consistency-Token header. Handlers
// added through [Server.Echo] use it to run commands.
func CallFrom(c echo.Context) framework.Call {
	p, _ := PrincipalFrom(c)
	k, _ := c.Get(keyIdempotencyClaim).(claimedKey)
	call := framework.Call{Principal: p, RequestID: RequestID(c), CorrelationID: CorrelationID(c),
		IdempotencyKey: k.key, IdempotencyOwner: k.owner, IdempotencyReclaimedFrom: k.reclaimedFrom,
		IdempotencyReclaimedSince: k.reclaimedSince, ConsistencyToken: c.Request().Header.Get(HeaderConsistencyToken)}
	if k.claim != nil {
		// Less the margin between this process's clock and Postgres's.
		call.IdempotencyLeaseUntil = k.claim.HeldUntil().Add(-committedCheckMargin)
	}
	return call
}

// begin is the outermost middleware: it assigns the ids, recovers panics,
// renders every error as the envelope and logs the request.
func (s *Server) begin(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		start := time.Now()
		req := c.Request()
		rid, corr := assignIDs(c)
		c.Set(keyServer, s)
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler { // net/http's way to abort a response: let it through
					panic(v)
				}
				err = &panicError{value: v, stack: debug.Stack()}
			}
			if err != nil {
				if werr := WriteError(c, err); werr != nil {
					s.logger.Warn("write error response", "request_id", rid, "error", werr)
				}
				err = nil
			}
			s.metrics.observe(methodLabel(req.Method), c.Path(), c.Response().Status, time.Since(start))
			s.logger.LogAttrs(req.Context(), slog.LevelInfo, "http request",
				slog.String("method", req.Method),
				slog.String("route", c.Path()),
				slog.String("path", req.URL.Path),
				slog.Int("status", c.Response().Status),
				slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
				slog.String("request_id", rid),
				slog.String("correlation_id", corr),
			)
		}()
		return next(c)
	}
}

// assignIDs takes the client's sane X-Request-ID and X-Correlation-ID or
// makes them (the correlation id defaults to the request id), keeps them on
// c and echoes them in the response headers.
func assignIDs(c echo.Context) (rid, corr string) {
	h := c.Request().Header
	rid = headerValue(h, canonicalRequestID)
	if !saneID(rid) {
		rid = newID()
	}
	corr = headerValue(h, canonicalCorrelationID)
	if !saneID(corr) {
		corr = rid
	}
	c.Set(keyRequestID, rid)
	c.Set(keyCorrelationID, corr)
	rh := c.Response().Header()
	rh[canonicalRequestID] = []string{rid}
	rh[canonicalCorrelationID] = []string{corr}
	return rid, corr
}

// rejectMalformedQuery answers 400 bad_request for a query string that
// does not decode (a bad %-escape, a semicolon): echo's QueryParam would
// drop the pair silently, so ?instance=%zz would read as no instance and
// an admin verb would act on the shared row.
func rejectMalformedQuery(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if raw := c.Request().URL.RawQuery; raw != "" {
			if _, err := url.ParseQuery(raw); err != nil {
				return badRequest("malformed query string: "+err.Error(), err)
			}
		}
		return next(c)
	}
}

// panicError is a recovered panic, rendered as an internal error.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("web: panic: %v", p.value) }

// Unwrap returns the panic value when it is an error.
func (p *panicError) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// saneID reports whether a client-sent id may be used: 1 to 128 printable
// ASCII characters (space included).
// The canonical forms of the id headers: http.Header's Get and Set
// canonicalize a key like X-Request-ID on every call, at an allocation each.
var (
	canonicalRequestID     = http.CanonicalHeaderKey(HeaderRequestID)
	canonicalCorrelationID = http.CanonicalHeaderKey(HeaderCorrelationID)
)

// headerValue is h.Get for a key in canonical form.
func headerValue(h http.Header, canonicalKey string) string {
	if v := h[canonicalKey]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func saneID(id string) bool {
	if id == "" || len(id) > maxIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x20 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// newID returns a fresh request id (a time-ordered UUID).
func newID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
}

// HeaderTimeout bounds reading a request's headers in servers made by
// [NewHTTPServer].
const HeaderTimeout = 10 * time.Second

// NewHTTPServer returns the http.Server that serves h on addr: a request's
// headers must arrive within [HeaderTimeout] (or readTimeout, if shorter)
// and its body within readTimeout, so a client that stalls or trickles
// cannot hold a connection (nor a graceful shutdown), even on a route that
// answers without reading the body; a keep-alive connection idle for
// idleTimeout is closed. The deadline bounds the reading only: net/http
// lifts it once the body is read (or at once without a body), so a long
// request or an SSE stream runs on.
func NewHTTPServer(addr string, h http.Handler, readTimeout, idleTimeout time.Duration) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: min(HeaderTimeout, readTimeout),
		ReadTimeout:       readTimeout,
		IdleTimeout:       idleTimeout,
	}
}
