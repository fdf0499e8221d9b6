package admin_test

import (
	"context"
	"os/exec"
	"strings"
	"sync"
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

// consoleProblems collects what the page writes to the console as errors
// (exceptions, console.error, failed loads) from now on; allowed reports
// whether one is expected. check fails t on the others.
func consoleProblems(t *testing.T, ctx context.Context, allowed func(chromedp.ConsoleMessage) bool) (check func()) {
	t.Helper()
	var mu sync.Mutex
	var bad []string
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if (m.IsException() || m.Type == chromedp.ConsoleError) && !allowed(m) {
				mu.Lock()
				bad = append(bad, m.String())
				mu.Unlock()
			}
		}
	}()
	return func() {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		require.Empty(t, bad, "console errors")
	}
}

// Every button of the page runs its verb on the row it sits in (shared and
// per-instance rows alike), and a refusal (409: a button made stale by a
// change elsewhere) shows the API's message until a verb succeeds. The
// page writes no error to the console besides the refused request itself.
func TestAdminPageButtonsRunVerbsAndShowRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx)) // the tab, so that Console sees the first load
	check := consoleProblems(t, ctx, func(m chromedp.ConsoleMessage) bool {
		return m.Source == "network" && strings.Contains(m.Text, "409")
	})
	bg := context.Background()
	click := func(name, verb, want string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx,
			chromedp.Click(chromedp.CSS(`tr[data-name="`+name+`"] button[data-verb="`+verb+`"]`)),
			chromedp.WaitVisible(chromedp.CSS(`tr.`+want+`[data-name="`+name+`"]`)),
		), "%s %s", verb, name)
	}

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.url+"/admin#token="+b.token(t, "admin")),
		chromedp.WaitVisible(chromedp.CSS(`tr.dead[data-name="adm:broken"] button[data-verb="skip"]`)),
		chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`),
	))

	// skip: past the poison event, into the dead letters.
	click("adm:broken", "skip", "idle")
	st, err := dispatcher.Status(bg, b.db.Pool, "adm:broken", "")
	require.NoError(t, err)
	require.Len(t, st.DeadLetters, 1)

	// restart: the next event kills it again; the button retries it.
	b.untilStatus(t, "adm:broken", "", dispatcher.StateDead)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`tr.dead[data-name="adm:broken"]`))))
	click("adm:broken", "restart", "idle")
	st, err = dispatcher.Status(bg, b.db.Pool, "adm:broken", "")
	require.NoError(t, err)
	require.Equal(t, dispatcher.StateIdle, st.Status)
	require.Zero(t, st.Attempts, "restart resets the attempts")

	// A per-instance row: the verbs reach its instance, not the shared row.
	click("adm:local", "disable", "disabled")
	st, err = dispatcher.Status(bg, b.db.Pool, "adm:local", "pod-1")
	require.NoError(t, err)
	require.Equal(t, dispatcher.StateDisabled, st.Status)
	click("adm:local", "enable", "idle")

	// A refusal: disabled elsewhere, the row's disable button is stale
	// until the next poll; clicking it shows the 409's message.
	require.NoError(t, dispatcher.Disable(bg, b.db.Pool, "adm:healthy", ""))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Click(chromedp.CSS(`tr.idle[data-name="adm:healthy"] button[data-verb="disable"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#error`)),
	))
	msg := tab{t, ctx}.text(`#error`)
	require.Contains(t, msg, "disable adm:healthy: consumer adm:healthy is disabled; disable needs idle or dead")
	// The refusal stays through the polls, until a verb succeeds.
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`tr.disabled[data-name="adm:healthy"]`))))
	require.Equal(t, msg, tab{t, ctx}.text(`#error`))
	click("adm:healthy", "enable", "idle")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitNotVisible(chromedp.CSS(`#error`))))
	check()
}
