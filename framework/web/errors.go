package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
)

// codeMethodNotAllowed is the code of a 405 (a route that exists for other
// methods). The core's code table has no 405 yet; see [statusOf].
const codeMethodNotAllowed framework.Code = "method_not_allowed"

// errorEnvelope is the body of every error response.
type errorEnvelope struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Code       framework.Code `json:"code"`
	HTTPStatus int            `json:"httpStatus"`
	Message    string         `json:"message"`
	Details    any            `json:"details,omitempty"`
	RequestID  string         `json:"requestId"`
}

// WriteError answers the request with the error envelope of err, converted
// by [framework.ToError] (echo's HTTP errors and oversized bodies are mapped
// to their codes as well). An internal error is shown as "internal error"
// without details, except for a write whose outcome is unknown
// ([framework.ErrCommitOutcomeUnknown]), which says so; it and every other
// 5xx are logged with the request id and the cause. When the response has already started, WriteError only logs.
// It returns an error only when writing the response fails.
func WriteError(c echo.Context, err error) error {
	if err == nil {
		err = errors.New("web: WriteError called with a nil error")
	}
	fe := toError(c, err)
	code, msg, details := fe.Code, fe.Message, fe.Details
	status := statusOf(code)
	if status == http.StatusInternalServerError && !errors.Is(err, framework.ErrCommitOutcomeUnknown) {
		// An unknown code is as opaque to the client as an internal one.
		code, msg, details = framework.CodeInternal, "internal error", nil
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	logError(c, err, code, status)
	if c.Response().Committed {
		return nil
	}
	if c.Request().Method == http.MethodHead {
		return c.NoContent(status)
	}
	return c.JSON(status, errorEnvelope{Error: errorBody{
		Code:       code,
		HTTPStatus: status,
		Message:    msg,
		Details:    details,
		RequestID:  RequestID(c),
	}})
}

// toError is framework.ToError that also knows echo's and net/http's errors.
func toError(c echo.Context, err error) *framework.Error {
	fe := framework.ToError(err)
	if fe.Code != framework.CodeInternal {
		return fe
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return fromHTTPError(c, he)
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge(mbe.Limit, err)
	}
	return fe
}

// fromHTTPError maps an echo.HTTPError (the router's 404 and 405, or one a
// handler returned) to a Kumiko error by its status.
func fromHTTPError(c echo.Context, he *echo.HTTPError) *framework.Error {
	msg, _ := he.Message.(string)
	req := c.Request()
	switch {
	case errors.Is(he, echo.ErrNotFound):
		return &framework.Error{Code: framework.CodeNotFound, Message: fmt.Sprintf("no route for %s %s", req.Method, req.URL.EscapedPath()), Err: he}
	case errors.Is(he, echo.ErrMethodNotAllowed):
		e := &framework.Error{Code: codeMethodNotAllowed, Message: fmt.Sprintf("method %s is not allowed on %s", req.Method, req.URL.EscapedPath()), Err: he}
		if allow := c.Response().Header().Get(echo.HeaderAllow); allow != "" {
			e.Details = map[string]any{"allow": allow}
		}
		return e
	}
	var code framework.Code
	switch he.Code {
	case http.StatusBadRequest:
		code = framework.CodeBadRequest
	case http.StatusUnauthorized:
		code = framework.CodeUnauthorized
	case http.StatusForbidden:
		code = framework.CodeAccessDenied
	case http.StatusNotFound:
		code = framework.CodeNotFound
	case http.StatusMethodNotAllowed:
		code = codeMethodNotAllowed
	case http.StatusConflict:
		code = framework.CodeConflict
	case http.StatusRequestEntityTooLarge:
		code = framework.CodePayloadTooLarge
	case http.StatusUnprocessableEntity:
		code = framework.CodeUnprocessable
	case http.StatusServiceUnavailable:
		code = framework.CodeUnavailable
	default:
		if he.Code >= 400 && he.Code < 500 {
			code = framework.CodeBadRequest
		} else {
			code = framework.CodeInternal
		}
	}
	return &framework.Error{Code: code, Message: msg, Err: he}
}

// statusOf is Code.HTTPStatus plus the codes the core does not know yet.
func statusOf(code framework.Code) int {
	if code == codeMethodNotAllowed {
		return http.StatusMethodNotAllowed
	}
	return code.HTTPStatus()
}

// tooLarge is the 413 for a body above limit bytes.
func tooLarge(limit int64, cause error) *framework.Error {
	return &framework.Error{
		Code:    framework.CodePayloadTooLarge,
		Message: fmt.Sprintf("request body exceeds the limit of %d bytes", limit),
		Details: map[string]any{"limit": limit},
		Err:     cause,
	}
}

// logError logs 500s at error level with their cause (and the stack of a
// recovered panic), other 5xx (a 503 while a dependency is away) at warn
// level with their cause, a request the client canceled at info level, a
// 403 the database gave (42501) at warn level with its cause, and other
// client errors at debug level.
func logError(c echo.Context, err error, code framework.Code, status int) {
	logger := loggerOf(c)
	req := c.Request()
	attrs := []slog.Attr{
		slog.String("request_id", RequestID(c)),
		slog.String("correlation_id", CorrelationID(c)),
		slog.String("method", req.Method),
		slog.String("path", req.URL.Path),
		slog.String("code", string(code)),
		slog.Int("status", status),
	}
	if status < 500 {
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "42501" {
			// The database refused what feature code ran as the tenant
			// role (a table whose migration forgot kumiko_enable_tenancy
			// or a grant, a row for another tenant): the client gets the
			// 403, the operator the reason.
			attrs = append(attrs, slog.String("error", err.Error()))
			logger.LogAttrs(req.Context(), slog.LevelWarn, "request denied by the database", attrs...)
			return
		}
		logger.LogAttrs(req.Context(), slog.LevelDebug, "request failed", attrs...)
		return
	}
	attrs = append(attrs, slog.String("error", err.Error()))
	if status != http.StatusInternalServerError {
		// A 503 is expected while a dependency is away (a restart, an
		// outage): the client is told to retry, the operator sees why.
		logger.LogAttrs(req.Context(), slog.LevelWarn, "request failed", attrs...)
		return
	}
	if req.Context().Err() != nil && errors.Is(err, context.Canceled) {
		// The client went away; nobody reads the answer.
		logger.LogAttrs(req.Context(), slog.LevelInfo, "request canceled", attrs...)
		return
	}
	var pe *panicError
	if errors.As(err, &pe) {
		attrs = append(attrs, slog.String("stack", string(pe.stack)))
	}
	msg := "internal error"
	if pe != nil {
		msg = "panic recovered"
	}
	logger.LogAttrs(req.Context(), slog.LevelError, msg, attrs...)
}

// Logger returns the logger of the [Server] handling c with the request's
// request_id and correlation_id attached, for a handler that logs what it
// does (a long maintenance verb saying what it waits for). Outside a
// Server's request it returns a logger that discards.
func Logger(c echo.Context) *slog.Logger {
	return loggerOf(c).With("request_id", RequestID(c), "correlation_id", CorrelationID(c))
}

// loggerOf returns the logger of the server handling c, or a discarding one.
func loggerOf(c echo.Context) *slog.Logger {
	if s, ok := c.Get(keyServer).(*Server); ok {
		return s.logger
	}
	return slog.New(slog.DiscardHandler)
}
