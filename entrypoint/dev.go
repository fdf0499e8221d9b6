package entrypoint

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/kumiko-go/kumiko/framework/auth"
)

// The identity of the development token.
const (
	// DevTenant is the tenant of the token GET /dev/token hands out.
	DevTenant = "dev"
	// DevUser is the user of the token GET /dev/token hands out.
	DevUser = "dev"
	// DevTokenPath is the route of the development token.
	DevTokenPath = "/dev/token"
	// devTokenTTL is the development token's lifetime.
	devTokenTTL = 24 * time.Hour
)

// DevToken is the body of GET /dev/token.
type DevToken struct {
	// Token is a JWT for [DevTenant] and [DevUser].
	Token string `json:"token"`
	// TenantID is [DevTenant].
	TenantID string `json:"tenantId"`
	// UserID is [DevUser].
	UserID string `json:"userId"`
	// ExpiresAt is when the token expires.
	ExpiresAt time.Time `json:"expiresAt"`
}

// mountDevToken adds GET /dev/token, which mints a token for the dev tenant
// and sets it as the kumiko_auth cookie, so the demo page (and its
// EventSource, which cannot send headers) works straight after `make run`.
// New mounts it only in all-in-one mode with KUMIKO_DEV=1: anyone who can
// reach it gets a valid token.
func (a *App) mountDevToken(e *echo.Echo, ring *auth.Keyring) {
	a.log.Warn("dev token endpoint enabled: never set KUMIKO_DEV in production", "path", DevTokenPath, "tenant_id", DevTenant)
	e.GET(DevTokenPath, func(c echo.Context) error {
		exp := time.Now().Add(devTokenTTL)
		tok, err := ring.Mint(auth.Principal{UserID: DevUser, TenantID: DevTenant}, devTokenTTL)
		if err != nil {
			return err
		}
		c.SetCookie(&http.Cookie{
			Name: auth.CookieName, Value: tok, Path: "/", Expires: exp,
			HttpOnly: true, SameSite: http.SameSiteStrictMode,
		})
		c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
		return c.JSON(http.StatusOK, DevToken{Token: tok, TenantID: DevTenant, UserID: DevUser, ExpiresAt: exp.UTC().Truncate(time.Second)})
	})
}
