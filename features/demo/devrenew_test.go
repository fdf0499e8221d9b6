package demo_test

import (
	"context"
	"syscall"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestDemoPageRenewsItsDevToken: in dev mode, a page whose token the
// server no longer accepts (expired after its 24 hours, or signed with a
// secret the server dropped) fetches a new one from /dev/token and goes on,
// instead of asking for a token: the server does hand them out, and a pasted
// one could not replace the HttpOnly cookie /dev/token set.
func TestDemoPageRenewsItsDevToken(t *testing.T) {
	t.Parallel()
	srv, _ := newDemo(t)
	srv.start()

	ctx := openBrowser(t)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.url()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
	))

	// The page's token stops verifying: the server comes back with
	// another secret.
	srv.stop(syscall.SIGTERM)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#status.down`))))
	srv.env["JWT_SECRET"] = "demo-browser-test-other-secret-0123456789"
	srv.start()

	waitCtx, cancelWait := context.WithTimeout(ctx, wait/2)
	defer cancelWait()
	require.NoError(t, chromedp.Do(waitCtx,
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
		chromedp.SendKeys(chromedp.CSS(`#customer`), "Renewed Rita"),
		chromedp.Click(chromedp.CSS(`#place`)),
		chromedp.WaitVisible(row("Renewed Rita")),
	), "the page goes on with a new dev token")
	login, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`getComputedStyle(document.getElementById('login')).display !== 'none'`))
	require.NoError(t, err)
	require.False(t, login, "no token asked for")
	errText, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#error`)))
	require.NoError(t, err)
	require.Empty(t, errText)
}
