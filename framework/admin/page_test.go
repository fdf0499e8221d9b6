package admin_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// browser starts a headless chromium (Debian's package) for the test. A
// machine without one fails the test, as the demo page's browser tests do
// (README: the tests need chromium; .ci/run installs it): a skip would
// pass a run that never looked at the page.
func browser(t *testing.T) context.Context {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("chromium is required for the admin page's browser tests: none on PATH (apt-get install chromium; .ci/run installs it)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(func() { cancelTimeout(); cancelCtx(); cancelAlloc() })
	return ctx
}

// tab is a browser tab of a test.
type tab struct {
	t   *testing.T
	ctx context.Context
}

// text returns the visible text of the first element matching sel.
func (p tab) text(sel string) string {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(p.t, err, sel)
	return v
}

// The page polls the list: it shows every consumer, highlights the dead
// one, follows state changes made elsewhere, and its buttons run verbs.
func TestAdminPageShowsConsumersLive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := browser(t)
	tok := b.token(t, "admin")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.url+"/admin#token="+tok),
		chromedp.WaitVisible(chromedp.CSS(`tr.dead[data-name="adm:broken"]`)),
	))
	require.Equal(t, "dead", tab{t, ctx}.text(`tr[data-name="adm:broken"] td.status`))
	require.Equal(t, "3", tab{t, ctx}.text(`tr[data-name="adm:broken"] td.lag`))
	require.Contains(t, tab{t, ctx}.text(`#summary`), "3 consumer row(s), 1 dead")
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.NotContains(t, loc, "token", "the token leaves the address bar")

	// A restart made elsewhere shows up with a following poll.
	require.NoError(t, dispatcher.Restart(context.Background(), b.db.Pool, "adm:broken", ""))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`tr.idle[data-name="adm:broken"]`))))

	// The disable button runs the verb.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`),
		chromedp.Click(chromedp.CSS(`tr[data-name="adm:healthy"] button[data-verb="disable"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr.disabled[data-name="adm:healthy"] button[data-verb="enable"]`)),
	))
	st, err := dispatcher.Status(context.Background(), b.db.Pool, "adm:healthy", "")
	require.NoError(t, err)
	require.Equal(t, dispatcher.StateDisabled, st.Status)
}

// Without the admin role the page shows the API's refusal and no rows.
func TestAdminPageShowsTheRefusalWithoutAdminRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.url+"/admin?token="+b.token(t, "user")),
		chromedp.WaitVisible(chromedp.CSS(`#error`)),
	))
	msg := tab{t, ctx}.text(`#error`)
	require.True(t, strings.Contains(msg, "the admin role is required"), msg)
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#consumers tr').length`))
	require.NoError(t, err)
	require.Zero(t, rows)
}
