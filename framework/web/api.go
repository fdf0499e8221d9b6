package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
)

// writeRequest is the body of POST /api/write.
type writeRequest struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
	// RequestID is the idempotency key of Kumiko's browser clients (the
	// Idempotency-Key header wins; see idempotency.go). It is not the
	// request id.
	RequestID string `json:"requestId"`
}

// batchRequest is the body of POST /api/batch.
type batchRequest struct {
	Commands []commandRequest `json:"commands"`
	// RequestID: see writeRequest.
	RequestID string `json:"requestId"`
}

// commandRequest is one command of a batch.
type commandRequest struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// queryRequest is the body of POST /api/query.
type queryRequest struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
	// ConsistencyToken is a write's token, for clients that cannot set
	// the X-Kumiko-Consistency-Token header (the header wins).
	ConsistencyToken string `json:"consistencyToken"`
}

// dataResponse is the body of every success.
type dataResponse struct {
	Data any `json:"data"`
}

// writeResponse is the body of a write's or batch's success: the data and
// the consistency token (also in the X-Kumiko-Consistency-Token header).
type writeResponse struct {
	Data             any    `json:"data"`
	ConsistencyToken string `json:"consistencyToken,omitempty"`
}

// handleWrite serves POST /api/write.
func (s *Server) handleWrite(c echo.Context) error {
	var req writeRequest
	if err := s.decodeBody(c, &req); err != nil {
		return err
	}
	if req.Type == "" {
		return missingType()
	}
	out, token, err := s.rt.WriteWithToken(c.Request().Context(), CallFrom(c), []framework.Command{{Type: req.Type, Payload: req.Payload}})
	if err != nil {
		return err
	}
	return writeWritten(c, out[0], token)
}

// handleBatch serves POST /api/batch.
func (s *Server) handleBatch(c echo.Context) error {
	var req batchRequest
	if err := s.decodeBody(c, &req); err != nil {
		return err
	}
	switch n := len(req.Commands); {
	case n == 0:
		return &framework.ValidationError{Fields: []framework.FieldError{{Field: "commands", Rule: "required",
			Message: "commands must hold at least one command"}}}
	case n > MaxBatchCommands:
		return &framework.ValidationError{Fields: []framework.FieldError{{Field: "commands", Rule: "max", Param: strconv.Itoa(MaxBatchCommands),
			Message: fmt.Sprintf("commands must hold at most %d commands, got %d", MaxBatchCommands, n)}}}
	}
	cmds := make([]framework.Command, len(req.Commands))
	for i, rc := range req.Commands {
		if rc.Type == "" {
			return &framework.BatchError{Index: i, Err: missingType()}
		}
		cmds[i] = framework.Command{Type: rc.Type, Payload: rc.Payload}
	}
	out, token, err := s.rt.WriteWithToken(c.Request().Context(), CallFrom(c), cmds)
	if err != nil {
		// The runtime names the index only for batches of two or more;
		// a batch client expects it for one command as well (not for a
		// write whose outcome is unknown: it failed as a whole).
		var be *framework.BatchError
		if len(cmds) == 1 && !errors.As(err, &be) && !errors.Is(err, framework.ErrCommitOutcomeUnknown) {
			err = &framework.BatchError{Index: 0, Err: err}
		}
		return err
	}
	return writeWritten(c, out, token)
}

// handleQuery serves POST /api/query.
func (s *Server) handleQuery(c echo.Context) error {
	var req queryRequest
	if err := s.decodeBody(c, &req); err != nil {
		return err
	}
	if req.Type == "" {
		return missingType()
	}
	if n := len(c.Request().Header.Values(HeaderConsistencyToken)); n > 1 {
		// Which write the client means to read is unknown, as with two
		// Idempotency-Key headers.
		return &framework.Error{Code: framework.CodeBadRequest,
			Message: fmt.Sprintf("send one %s header, not %d", HeaderConsistencyToken, n)}
	}
	call := CallFrom(c)
	if call.ConsistencyToken == "" {
		call.ConsistencyToken = req.ConsistencyToken
	}
	out, err := s.rt.Query(c.Request().Context(), call, framework.Command{Type: req.Type, Payload: req.Payload})
	if err != nil {
		return err
	}
	return writeData(c, out)
}

// missingType is the validation error of a command without a type.
func missingType() error {
	return &framework.ValidationError{Fields: []framework.FieldError{{Field: "type", Rule: "required", Message: "type is required"}}}
}

// writeData answers 200 {"data": v}. It encodes v before writing anything,
// so a result that cannot be encoded becomes an internal error envelope.
func writeData(c echo.Context, v any) error {
	b, err := json.Marshal(dataResponse{Data: v})
	if err != nil {
		return fmt.Errorf("web: encode response: %w", err)
	}
	return c.JSONBlob(http.StatusOK, b)
}

// writeWritten answers a write: 200 {"data": v, "consistencyToken": token}
// with the token in the X-Kumiko-Consistency-Token header too.
func writeWritten(c echo.Context, v any, token string) error {
	b, err := json.Marshal(writeResponse{Data: v, ConsistencyToken: token})
	if err != nil {
		return fmt.Errorf("web: encode response: %w", err)
	}
	if token != "" {
		c.Response().Header().Set(HeaderConsistencyToken, token)
	}
	return c.JSONBlob(http.StatusOK, b)
}
