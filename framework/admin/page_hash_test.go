package admin_test

import (
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// A token given to an open page (its URL again, with a new #token=: the
// browser does not reload for a new fragment) replaces the one it had,
// and leaves the address bar as the first one did.
func TestAdminPageTakesANewTokenFromTheFragment(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(b.url+"/admin#token="+b.token(t, "user")),
		chromedp.WaitVisible(chromedp.CSS(`#error`)),
		chromedp.Evaluate[chromedp.Void](`location.hash = "token=`+b.token(t, "admin")+`"`),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-name="adm:broken"]`)),
		chromedp.WaitNotVisible(chromedp.CSS(`#error`)),
	))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.NotContains(t, loc, "token", "the token leaves the address bar")
}
