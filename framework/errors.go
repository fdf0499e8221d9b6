package framework

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// Code is a machine-readable error code of Kumiko's HTTP error envelope.
type Code string

// The error codes of the HTTP contract, each with one HTTP status ([Code.HTTPStatus]).
const (
	CodeValidation             Code = "validation_error"        // 400
	CodeBadRequest             Code = "bad_request"             // 400
	CodeUnauthorized           Code = "unauthorized"            // 401
	CodeAccessDenied           Code = "access_denied"           // 403
	CodeNotFound               Code = "not_found"               // 404
	CodeVersionConflict        Code = "version_conflict"        // 409
	CodeConflict               Code = "conflict"                // 409
	CodePayloadTooLarge        Code = "payload_too_large"       // 413
	CodeUnprocessable          Code = "unprocessable"           // 422
	CodeIdempotencyKeyReused   Code = "idempotency_key_reused"  // 422
	CodeUnavailable            Code = "unavailable"             // 503
	CodeIdempotencyUnavailable Code = "idempotency_unavailable" // 503
	CodeInternal               Code = "internal"                // 500
)

// HTTPStatus returns the status that goes with the code (500 for unknown codes).
func (c Code) HTTPStatus() int {
	switch c {
	case CodeValidation, CodeBadRequest:
		return http.StatusBadRequest
	case CodeUnauthorized:
		return http.StatusUnauthorized
	case CodeAccessDenied:
		return http.StatusForbidden
	case CodeNotFound:
		return http.StatusNotFound
	case CodeVersionConflict, CodeConflict:
		return http.StatusConflict
	case CodePayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeUnprocessable, CodeIdempotencyKeyReused:
		return http.StatusUnprocessableEntity
	case CodeUnavailable, CodeIdempotencyUnavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// Error is the one user-facing error type: handlers return it (or wrap it)
// to choose the code, message and details the client sees. Any other error
// reaches the client as "internal error" and is logged.
type Error struct {
	// Code selects the HTTP status.
	Code Code
	// Message is shown to the client.
	Message string
	// Details is optional structured data shown to the client.
	Details any
	// Err is the cause, never shown to the client.
	Err error
}

// Error implements error.
func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrNotFound) match any *Error of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Sentinels for errors.Is; they match any *Error of their code.
var (
	ErrNotFound     = &Error{Code: CodeNotFound}
	ErrConflict     = &Error{Code: CodeConflict}
	ErrAccessDenied = &Error{Code: CodeAccessDenied}
)

// FieldError is one failed field of a [ValidationError].
type FieldError struct {
	// Field is the JSON path of the field, e.g. "customer".
	Field string `json:"field"`
	// Rule is the failed validation rule, e.g. "required" or "max".
	Rule string `json:"rule"`
	// Param is the rule's parameter, e.g. "200" for max=200.
	Param string `json:"param,omitempty"`
	// Message is a readable sentence.
	Message string `json:"message"`
}

// ValidationError reports invalid input, field by field (HTTP 400,
// validation_error). Nothing is written when it is returned.
type ValidationError struct {
	// Fields lists every failed field.
	Fields []FieldError
}

// Error implements error.
func (e *ValidationError) Error() string {
	if len(e.Fields) == 0 {
		return "validation failed"
	}
	msg := "validation failed: " + e.Fields[0].Message
	if len(e.Fields) > 1 {
		msg += fmt.Sprintf(" (and %d more)", len(e.Fields)-1)
	}
	return msg
}

// ConcurrencyError reports that a stream moved past the expected version
// (HTTP 409, version_conflict). Nothing of the command persists.
type ConcurrencyError = eventstore.ConcurrencyError

// ToError converts any error into the user-facing *Error: *Error as is
// (also when it wraps one of the others), *ValidationError to
// validation_error with the field list, a concurrency error to
// version_conflict; everything else to internal (Err keeps the cause for
// the log).
func ToError(err error) *Error {
	if err == nil {
		return nil
	}
	var be *BatchError
	if errors.As(err, &be) {
		return toBatchError(be)
	}
	// Before the validation and concurrency errors: a handler that wrapped
	// one in its own *Error chose what the client sees (neither of them
	// wraps an *Error, so the *Error found is the outer one).
	var fe *Error
	if errors.As(err, &fe) {
		return fe
	}
	var ve *ValidationError
	if errors.As(err, &ve) {
		return &Error{Code: CodeValidation, Message: ve.Error(), Details: map[string]any{"fields": ve.Fields}, Err: err}
	}
	var ce *ConcurrencyError
	if errors.As(err, &ce) {
		return versionConflict(ce, err)
	}
	if pe := translatePg(err); pe != nil {
		return pe
	}
	return &Error{Code: CodeInternal, Message: "internal error", Err: err}
}

// versionConflict is ToError for a *ConcurrencyError. actualVersion is
// left out when the version is unknown (a new stream that exists).
func versionConflict(ce *ConcurrencyError, err error) *Error {
	details := map[string]any{"stream": ce.Stream.String(), "expectedVersion": ce.Expected}
	msg := fmt.Sprintf("stream %s is at version %d, expected %d", ce.Stream, ce.Actual, ce.Expected)
	switch {
	case ce.Expected == NoStream:
		msg = fmt.Sprintf("stream %s exists, expected a new stream", ce.Stream)
	case ce.Actual < 0:
		msg = fmt.Sprintf("stream %s is not at the expected version %d", ce.Stream, ce.Expected)
	}
	if ce.Actual >= 0 {
		details["actualVersion"] = ce.Actual
	}
	return &Error{Code: CodeVersionConflict, Message: msg, Details: details, Err: err}
}

// toBatchError is ToError for a *BatchError: the command's envelope with
// its index added to the details.
func toBatchError(be *BatchError) *Error {
	inner := ToError(be.Err)
	details := map[string]any{"index": be.Index}
	if m, ok := inner.Details.(map[string]any); ok {
		for k, v := range m {
			details[k] = v
		}
	} else if inner.Details != nil {
		details["details"] = inner.Details
	}
	return &Error{Code: inner.Code, Message: fmt.Sprintf("command %d: %s", be.Index, inner.Message), Details: details, Err: be}
}

// NewConcurrencyError reports that stream is at version actual, not expected
// (HTTP 409, version_conflict); handlers return it after their own version
// check.
func NewConcurrencyError(stream Stream, expected, actual int64) *ConcurrencyError {
	return &ConcurrencyError{Stream: eventstore.StreamRef{Type: stream.Type, ID: stream.ID}, Expected: expected, Actual: actual}
}
