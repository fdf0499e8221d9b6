package demo_test

import (
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// TestDemoPageCancelsAndKeepsTheConsoleClean: an order placed through the
// form is cancelled with its row's button (the list follows the cancel
// event, and the row loses its button), and the page writes no error to
// the console: no exception, no failed load.
func TestDemoPageCancelsAndKeepsTheConsoleClean(t *testing.T) {
	t.Parallel()
	srv, _ := newDemo(t)
	srv.start()

	ctx := openBrowser(t)
	var mu sync.Mutex
	var bad []string
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				mu.Lock()
				bad = append(bad, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	}()

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.url()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
		chromedp.SendKeys(chromedp.CSS(`#customer`), "Cancel Carl"),
		chromedp.Click(chromedp.CSS(`#place`)),
		chromedp.WaitVisible(row("Cancel Carl")),
		chromedp.Click(chromedp.CSS(`#orders tbody tr[data-customer="Cancel Carl"] button`)),
		chromedp.WaitVisible(chromedp.CSS(`#orders tbody tr[data-customer="Cancel Carl"][data-status="cancelled"]`)),
	))
	buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#orders tbody tr[data-status="cancelled"] button').length`))
	require.NoError(t, err)
	require.Zero(t, buttons, "a cancelled order offers no cancel")
	errText, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#error`)))
	require.NoError(t, err)
	require.Empty(t, errText)

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, bad, "console errors")
}
