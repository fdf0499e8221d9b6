package demo_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework/auth"
)

// mint signs a token for tenant with secret (a JWT_SECRET value).
func mint(t *testing.T, secret, tenant string) string {
	t.Helper()
	ck, err := config.ParseJWTKeys(secret)
	require.NoError(t, err)
	ring, err := auth.NewKeyring([]auth.Key{{ID: ck[0].ID, Secret: ck[0].Secret}})
	require.NoError(t, err)
	tok, err := ring.Mint(auth.Principal{UserID: "alice", TenantID: tenant}, time.Hour)
	require.NoError(t, err)
	return tok
}

// TestDemoPageForgetsTheOtherTenantsOrders: a token of another tenant,
// pasted when the page asks for one, shows that tenant's orders only, not
// the ones the page showed for the tenant before.
func TestDemoPageForgetsTheOtherTenantsOrders(t *testing.T) {
	t.Parallel()
	srv, _ := newDemo(t)
	delete(srv.env, "KUMIKO_DEV")
	srv.start()

	ctx := openBrowser(t)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.url()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#login`)),
		chromedp.SetValue(chromedp.CSS(`#token`), mint(t, jwtSecret, "acme")),
		chromedp.Click(chromedp.CSS(`#use-token`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
		chromedp.SendKeys(chromedp.CSS(`#customer`), "Acme Ann"),
		chromedp.Click(chromedp.CSS(`#place`)),
		chromedp.WaitVisible(row("Acme Ann")),
	))

	// The token stops verifying (the server comes back with another
	// secret); the page asks for one, and gets one of another tenant.
	srv.stop(syscall.SIGTERM)
	other := "demo-browser-test-other-secret-0123456789"
	srv.env["JWT_SECRET"] = other
	srv.start()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(`#login`)),
		chromedp.SetValue(chromedp.CSS(`#token`), mint(t, other, "globex")),
		chromedp.Click(chromedp.CSS(`#use-token`)),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
		chromedp.SendKeys(chromedp.CSS(`#customer`), "Globex Gus"),
		chromedp.Click(chromedp.CSS(`#place`)),
		chromedp.WaitVisible(row("Globex Gus")),
	))
	tenant, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#tenant`)))
	require.NoError(t, err)
	require.Equal(t, "globex", tenant)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#orders tbody tr')].map((r) => r.dataset.customer)`))
	require.NoError(t, err)
	require.Equal(t, []string{"Globex Gus"}, rows, "acme's orders are not globex's")
}
