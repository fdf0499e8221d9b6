package web

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
)

// decodeBody reads the request body (at most the body limit) and decodes it
// into v with [DecodeJSON].
func (s *Server) decodeBody(c echo.Context, v any) error {
	body, err := readBody(c, s.bodyLimit)
	if err != nil {
		return err
	}
	return DecodeJSON(body, s.maxDepth, v)
}

// readBody reads the whole body, failing with payload_too_large beyond limit
// bytes (at once when Content-Length says so).
func readBody(c echo.Context, limit int64) ([]byte, error) {
	req := c.Request()
	if req.ContentLength > limit {
		return nil, tooLarge(limit, nil)
	}
	b, err := io.ReadAll(http.MaxBytesReader(c.Response().Writer, req.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(limit, err)
		}
		return nil, &framework.Error{Code: framework.CodeBadRequest, Message: "cannot read the request body", Err: err}
	}
	return b, nil
}

// DecodeJSON decodes body, which must be exactly one JSON object nested at
// most maxDepth deep, into v, rejecting fields v does not have. Every failure
// is a bad_request *framework.Error with a message in the client's terms: a
// field named by its JSON path and the JSON kind it takes
// ("olderThanDays must be an integer, got number 1.5"), never by Go names.
// Routes added through [Server.Echo] decode their bodies with it.
func DecodeJSON(body []byte, maxDepth int, v any) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return badRequest("the request body is empty; expected a JSON object", nil)
	}
	if trimmed[0] != '{' {
		return badRequest("the request body must be a JSON object", nil)
	}
	shallow, nul := scanJSON(trimmed, maxDepth)
	if !shallow {
		return badRequest(fmt.Sprintf("the request body nests deeper than %d levels", maxDepth), nil)
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(trimmed, v, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("the request body has data after its JSON object", err)
	}
	if nul {
		return badRequest(`a string in the request body contains \u0000 (NUL), which cannot be stored`, nil)
	}
	return nil
}

// decodeError explains the encoding/json error of decoding body into v in
// the client's terms, naming a field by its JSON path (commands[2].type).
func decodeError(body []byte, v any, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return badRequest(fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: ")), err)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return badRequest("malformed JSON: unexpected end of the request body", err)
	case errors.As(err, &te):
		field := cmp.Or(framework.DecodeErrorPath(body, v), te.Field, "the request body")
		return badRequest(fmt.Sprintf("%s must be %s, got %s", framework.Excerpt(field), jsonKind(te.Type), framework.Excerpt(te.Value)), err)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if path := framework.DecodeErrorPath(body, v); path != "" {
			name = strconv.Quote(path)
		}
		return badRequest("unknown field "+framework.Excerpt(name)+" in the request body", err)
	}
	return badRequest("invalid request body: "+strings.TrimPrefix(err.Error(), "json: "), err)
}

// jsonKind names the JSON kind a Go type decodes from (an integer for Go
// integers: 1.5 does not decode into one).
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return "an object"
	}
}

func badRequest(msg string, cause error) *framework.Error {
	return &framework.Error{Code: framework.CodeBadRequest, Message: msg, Err: cause}
}

// scanJSON reports whether the objects and arrays of the JSON text b nest
// at most maxDepth deep, and whether a string in b holds the escape \u0000
// (a NUL, which Postgres stores neither in text nor in jsonb). It only counts
// brackets outside strings; whether b is valid JSON is the decoder's
// business.
func scanJSON(b []byte, maxDepth int) (shallow, nul bool) {
	depth := 0
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		ch := b[i]
		if inString {
			switch {
			case escaped:
				escaped = false
				if ch == 'u' && len(b) > i+4 && string(b[i+1:i+5]) == "0000" {
					nul = true
				}
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
			continue
		}
		switch ch {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > maxDepth {
				return false, nul
			}
		case '}', ']':
			depth--
		}
	}
	return true, nul
}
