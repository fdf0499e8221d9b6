package web

import (
	"fmt"

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
