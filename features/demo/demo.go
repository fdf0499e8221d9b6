// Package demo is the sample app's demo page, served at /: a plain HTML
// page (no build step) with a form that places orders and a list of the
// tenant's orders that updates live from the SSE stream (GET /api/sse with
// an EventSource, resuming with the last event id after a reconnect).
//
// The page authenticates with the kumiko_auth cookie, which an EventSource
// sends on its own. In all-in-one mode with KUMIKO_DEV=1 (what `make run`
// sets) it fetches that cookie from GET /dev/token, for the tenant "dev";
// otherwise it asks for a token (`kumiko token --tenant T --user U`) and
// stores it in the cookie.
package demo

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework/web"
)

// Path is where the page is served.
const Path = "/"

//go:embed index.html
var page []byte

// Page returns the page's HTML.
func Page() []byte { return page }

// Mount adds GET / (the page) to s.
func Mount(s *web.Server) {
	s.Echo().GET(Path, serve)
}

func serve(c echo.Context) error {
	h := c.Response().Header()
	h.Set(echo.HeaderCacheControl, "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'")
	return c.Blob(http.StatusOK, echo.MIMETextHTMLCharsetUTF8, page)
}
