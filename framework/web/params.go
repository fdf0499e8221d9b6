package web

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
)

// QueryParam returns the value of the single-valued query parameter name
// ("" when absent). A parameter given more than once (?instance=a&instance=b)
// is a bad_request naming it: echo's QueryParam would silently take the
// first value. Parameters that may repeat (SSE's types) read
// c.QueryParams() instead.
func QueryParam(c echo.Context, name string) (string, error) {
	vals := c.QueryParams()[name]
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
		return vals[0], nil
	}
	return "", &framework.Error{Code: framework.CodeBadRequest,
		Message: fmt.Sprintf("the query parameter %s is given %d times; give it once", name, len(vals)),
		Details: map[string]any{"parameter": name}}
}

// SelectorParam is [QueryParam] for a parameter whose absence widens what
// the request acts on or reads (?instance= the shared row, ?state= every
// state): given but blank, as an unset variable in a script gives it, it is
// a validation_error naming it rather than a silent fall-back to that
// default, as the CLI refuses a blank flag.
func SelectorParam(c echo.Context, name string) (string, error) {
	v, err := QueryParam(c, name)
	if err != nil {
		return "", err
	}
	if _, given := c.QueryParams()[name]; given {
		if err := RefuseBlank(name, v); err != nil {
			return "", err
		}
	}
	return v, nil
}

// RefuseBlank returns a validation_error naming field when v, given, is
// blank (empty or only white space); see [SelectorParam].
func RefuseBlank(field, v string) error {
	if strings.TrimSpace(v) != "" {
		return nil
	}
	return &framework.ValidationError{Fields: []framework.FieldError{{Field: field, Rule: "required",
		Message: field + " is empty; leave it out for its default"}}}
}

// PathParam returns the path parameter name, %-decoded. When a request
// path was sent escaped (a client escaping an id's ':' or '@', or any
// other character), echo matches on the raw path and hands out every
// parameter still escaped: each must be decoded, not just the one a client
// is expected to escape. A malformed escape is a bad_request naming the
// parameter.
func PathParam(c echo.Context, name string) (string, error) {
	v := c.Param(name)
	if c.Request().URL.RawPath == "" {
		return v, nil
	}
	u, err := url.PathUnescape(v)
	if err != nil {
		return "", &framework.Error{Code: framework.CodeBadRequest, Message: "malformed " + name + " in the path", Err: err}
	}
	return u, nil
}
