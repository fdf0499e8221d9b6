package web

import (
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
)

// Authenticate is middleware that verifies the request's JWT (the bearer
// Authorization header, else the kumiko_auth cookie) with the server's
// keyring and stores the caller for [PrincipalFrom] and [CallFrom]. A
// missing, malformed, forged or expired token, one for the reserved tenant,
// or a request with more than one Authorization header (or, without a bearer
// token, more than one kumiko_auth cookie) is answered 401 unauthorized. A
// cookie-authenticated request with
// a method other than GET, HEAD or OPTIONS must send Content-Type
// application/json (or another JSON media type), else it is answered 403
// access_denied: a cross-site form cannot send that type, so the cookie
// cannot be used for cross-site request forgery.
func (s *Server) Authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if n := len(req.Header.Values(echo.HeaderAuthorization)); n > 1 {
			// Which one counts is up to each reader of the request (this
			// server would take the first, a proxy maybe the last).
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer error="invalid_request"`)
			return &framework.Error{Code: framework.CodeUnauthorized,
				Message: fmt.Sprintf("send one Authorization header, not %d", n)}
		}
		if !hasBearer(req) {
			if n := len(req.CookiesNamed(auth.CookieName)); n > 1 {
				// As with two headers: this server would take the first, a
				// proxy maybe the last; and a sibling subdomain can add one
				// for a more specific path, which browsers send first.
				c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer error="invalid_request"`)
				return &framework.Error{Code: framework.CodeUnauthorized,
					Message: fmt.Sprintf("send one %s cookie, not %d", auth.CookieName, n)}
			}
		}
		tok := auth.TokenFromRequest(req)
		if tok == "" {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, "Bearer")
			return &framework.Error{Code: framework.CodeUnauthorized,
				Message: "missing token: send Authorization: Bearer <token> or the " + auth.CookieName + " cookie"}
		}
		p, until, err := s.keys.VerifyUntil(tok)
		if err != nil {
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer error="invalid_token"`)
			return &framework.Error{Code: framework.CodeUnauthorized, Message: "invalid or expired token", Err: err}
		}
		if !hasBearer(req) && !safeMethod(req.Method) && !isJSON(req.Header.Get(echo.HeaderContentType)) {
			return &framework.Error{Code: framework.CodeAccessDenied,
				Message: "a request authenticated by the " + auth.CookieName + " cookie must send Content-Type: application/json"}
		}
		c.Set(keyPrincipal, p)
		c.Set(keyTokenExpiry, until)
		return next(c)
	}
}

// TokenExpiry returns the instant the request's token stops verifying (its
// exp plus the verifier's leeway), and false on a route [Server.Authenticate]
// does not protect. A long-lived response (an SSE stream) ends then, so
// that it lives no longer than its credentials.
func TokenExpiry(c echo.Context) (time.Time, bool) {
	t, ok := c.Get(keyTokenExpiry).(time.Time)
	return t, ok
}

// PrincipalFrom returns the caller [Server.Authenticate] stored, and false
// on a route it does not protect.
func PrincipalFrom(c echo.Context) (auth.Principal, bool) {
	p, ok := c.Get(keyPrincipal).(auth.Principal)
	return p, ok
}

// hasBearer reports whether the token comes from the Authorization header
// (the rule of auth.TokenFromRequest) rather than the cookie.
func hasBearer(r *http.Request) bool {
	scheme, tok, ok := strings.Cut(r.Header.Get(echo.HeaderAuthorization), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && strings.TrimSpace(tok) != ""
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// isJSON reports whether a Content-Type is application/json or a +json type.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == echo.MIMEApplicationJSON || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")))
}
