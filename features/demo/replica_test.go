package demo_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/internal/pgcluster"
)

// TestDemoPageOnALaggingReplica: with DATABASE_READ_URL on a streaming
// standby whose replay is paused, an order the stream's hub already had
// when the page opened its stream is not sent live, and a list loaded
// from the standby does not show it. The page loads its list with the
// token of the stream's opening frame, so it shows the order anyway.
func TestDemoPageOnALaggingReplica(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := pgcluster.New(t)
	settings := []string{"wal_level=replica", "max_wal_senders=4", "hot_standby=on"}
	primary := d.Start(d.InitDB("primary"), settings...)
	admin, err := pgx.Connect(ctx, primary.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `CREATE DATABASE kumiko`)
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	pool, err := pgxpool.New(ctx, primary.URL("kumiko"))
	require.NoError(t, err)
	_, err = migrate.Up(ctx, pool, nil, nil)
	pool.Close()
	require.NoError(t, err)
	standbyDir := filepath.Join(d.Path, "standby")
	d.Run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.Port), "-U", "postgres",
		"-D", standbyDir, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	standby := d.Start(standbyDir, settings...)

	srv := newServer(t, primary.URL("kumiko"), jobstest.StartRedis(t).URL)
	srv.env["DATABASE_READ_URL"] = standby.URL("kumiko")
	srv.start()

	standbyAdmin, err := pgx.Connect(ctx, standby.URL("kumiko"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = standbyAdmin.Close(context.Background()) })
	_, err = standbyAdmin.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		return standbyAdmin.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state) == nil && state == "paused"
	}, 10*time.Second, 10*time.Millisecond)

	// An order reaches the server's hub (a stream of the tenant gets it)
	// before the page opens its stream.
	ck, err := config.ParseJWTKeys(jwtSecret)
	require.NoError(t, err)
	ring, err := auth.NewKeyring([]auth.Key{{ID: ck[0].ID, Secret: ck[0].Secret}})
	require.NoError(t, err)
	tok, err := ring.Mint(auth.Principal{UserID: "watcher", TenantID: entrypoint.DevTenant}, time.Hour)
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, srv.url()+sse.Path+"?types=orders:event:placed", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	placeViaAPI(t, srv, "Before Ada")
	rd := sse.NewReader(res.Body)
	for {
		ev, err := rd.Next()
		require.NoError(t, err)
		if ev.Type == "orders:event:placed" {
			break
		}
	}

	bctx := openBrowser(t)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.url()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
	))
	waitCtx, cancelWait := context.WithTimeout(bctx, 10*time.Second)
	defer cancelWait()
	require.NoError(t, chromedp.Do(waitCtx, chromedp.WaitVisible(row("Before Ada"))),
		"the list loaded with the stream's token shows the order the stream does not send")

	_, err = standbyAdmin.Exec(ctx, `SELECT pg_wal_replay_resume()`)
	require.NoError(t, err)
	placeViaAPI(t, srv, "After Bob")
	require.NoError(t, chromedp.Do(bctx, chromedp.WaitVisible(row("After Bob"))))
}
