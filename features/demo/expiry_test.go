package demo_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
)

// TestDemoPageAsksForTokenAfterExpiry: the stream ends when its token
// expires; the page then asks for a new token instead of retrying forever.
func TestDemoPageAsksForTokenAfterExpiry(t *testing.T) {
	t.Parallel()
	srv, _ := newDemo(t)
	delete(srv.env, "KUMIKO_DEV")
	srv.start()

	ctx := openBrowser(t)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.url()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#login`)),
	))
	// Past its exp, but within the verifier's 30 s leeway for another
	// 12 s: long enough to open the stream on a loaded machine, short
	// enough to expire while the test waits.
	keys, err := config.ParseJWTKeys(jwtSecret)
	require.NoError(t, err)
	claims := jwt.MapClaims{"sub": "alice", "tenantId": "acme", "roles": []string{},
		"iat": time.Now().Add(-time.Hour).Unix(), "exp": time.Now().Add(-18 * time.Second).Unix()}
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims)
	if keys[0].ID != "" {
		tok.Header["kid"] = keys[0].ID
	}
	signed, err := tok.SignedString(keys[0].Secret)
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx,
		// SetValue, not SendKeys: typing a JWT key by key takes seconds of
		// the token's short remaining life on a loaded machine.
		chromedp.SetValue(chromedp.CSS(`#token`), signed),
		chromedp.Click(chromedp.CSS(`#use-token`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
		chromedp.WaitNotVisible(chromedp.CSS(`#login`)),
	))
	waitCtx, cancelWait := context.WithTimeout(ctx, wait)
	defer cancelWait()
	require.NoError(t, chromedp.Do(waitCtx,
		chromedp.WaitVisible(chromedp.CSS(`#login`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.down`)),
	), "the page asks for a token once its own has expired")
}
