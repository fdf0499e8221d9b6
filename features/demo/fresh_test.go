package demo_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
)

// TestDemoPageCatchesUpWithoutEventID: a page whose stream has not carried
// an event yet has no id to resume from; after a server restart it still
// shows the orders written while the server was down.
func TestDemoPageCatchesUpWithoutEventID(t *testing.T) {
	t.Parallel()
	srv, db := newDemo(t)
	srv.start()

	ctx := openBrowser(t)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.url()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
	))
	srv.stop(syscall.SIGTERM)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#status.down`))))
	reg := framework.NewRegistry()
	features.Register(reg)
	require.NoError(t, reg.Build())
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	for _, c := range []string{"Offline Carol", "Offline Dan"} {
		_, err := rt.Write(context.Background(), framework.Call{Principal: framework.Principal{UserID: "other", TenantID: entrypoint.DevTenant}},
			[]framework.Command{{Type: "orders:write:place", Payload: []byte(fmt.Sprintf(`{"customer":%q,"amountCents":500}`, c))}})
		require.NoError(t, err)
	}
	srv.start()
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`#status.live`))))
	waitCtx, cancelWait := context.WithTimeout(ctx, wait/2)
	defer cancelWait()
	require.NoError(t, chromedp.Do(waitCtx,
		chromedp.WaitVisible(row("Offline Carol")),
		chromedp.WaitVisible(row("Offline Dan")),
	), "the orders written while the server was down")

	// Live afterwards, each order once.
	placeViaAPI(t, srv, "After Erin")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(row("After Erin"))))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#orders tbody tr').length`))
	require.NoError(t, err)
	require.Equal(t, 3, rows)
}
