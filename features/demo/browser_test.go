package demo_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// chromium is Debian's chromium, which .ci/run installs when missing.
const chromium = "/usr/bin/chromium"

const (
	wait      = 30 * time.Second
	jwtSecret = "demo-browser-test-secret-0123456789abcdef"
)

// binary is the kumiko binary, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kumiko-demo-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binary = filepath.Join(dir, "kumiko")
	if err := proctest.Build("github.com/kumiko-go/kumiko/cmd/kumiko", binary); err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// server runs `kumiko serve` in all-in-one mode with KUMIKO_DEV=1 (what
// `make run` does) on a fixed address, so that it can be restarted. Each
// run is killed with SIGKILL when the test ends, and its logs are shown if
// the test failed.
type server struct {
	t    *testing.T
	env  map[string]string
	addr string
	proc *proctest.Proc
}

// newDemo returns a server (not started) of the demo app on a database and
// a Redis of its own, and that database.
func newDemo(t *testing.T) (*server, *kumikotest.DB) {
	t.Helper()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	return newServer(t, db.URL, rds.URL), db
}

func newServer(t *testing.T, dbURL, redisURL string) *server {
	t.Helper()
	addr := proctest.FreeAddr(t)
	return &server{t: t, addr: addr, env: map[string]string{
		"APP_MODE": "all-in-one", "KUMIKO_DEV": "1", "HTTP_ADDR": addr, "WORKER_HTTP_ADDR": "127.0.0.1:0",
		"DATABASE_URL": dbURL, "REDIS_URL": redisURL, "JWT_SECRET": jwtSecret,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "50",
	}}
}

func (s *server) url() string { return "http://" + s.addr }

// start starts the process and waits until it is ready.
func (s *server) start() {
	s.t.Helper()
	s.proc = proctest.Start(s.t, binary, "server", s.env, "serve")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 3 * time.Second}
	deadline := time.Now().Add(wait)
	for {
		resp, err := client.Get(s.url() + "/health/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		require.True(s.t, time.Now().Before(deadline), "server not ready: %v", err)
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends sig and waits for the process to exit.
func (s *server) stop(sig syscall.Signal) {
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(sig)
	<-s.proc.Exited()
	s.proc = nil
}

// placeViaAPI places an order for the dev tenant through the HTTP API.
func placeViaAPI(t *testing.T, s *server, customer string) {
	t.Helper()
	ck, err := config.ParseJWTKeys(jwtSecret)
	require.NoError(t, err)
	ring, err := auth.NewKeyring([]auth.Key{{ID: ck[0].ID, Secret: ck[0].Secret}})
	require.NoError(t, err)
	tok, err := ring.Mint(auth.Principal{UserID: "api-user", TenantID: entrypoint.DevTenant}, time.Hour)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, s.url()+"/api/write",
		strings.NewReader(fmt.Sprintf(`{"type":"orders:write:place","payload":{"customer":%q,"amountCents":1250}}`, customer)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: wait}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// row selects the list row of a customer.
func row(customer string) chromedp.CSS {
	return chromedp.CSS(fmt.Sprintf(`#orders tbody tr[data-customer=%q]`, customer))
}

// openBrowser starts a headless chromium for t (failing t when there is
// none) and returns a context of 3*wait on it; both end with t.
func openBrowser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("chromium is required for the browser test (apt-get install chromium; .ci/run installs it): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(cancelBrowser)
	require.NoError(t, chromedp.Do(browser)) // starts the browser (no timeout on this first call)
	ctx, cancel := context.WithTimeout(browser, 3*wait)
	t.Cleanup(cancel)
	return ctx
}

// TestDemoPageInBrowser drives the demo page in chromium: an order placed
// through the form appears in the list, one placed through the API appears
// too, and after a server restart the orders written while it was down
// appear once the page has reconnected, each exactly once.
func TestDemoPageInBrowser(t *testing.T) {
	t.Parallel()
	srv, db := newDemo(t)
	srv.start()

	ctx := openBrowser(t)

	// The page gets the dev token and goes live.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(srv.url()+"/"),
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
	))
	tenant, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#tenant`)))
	require.NoError(t, err)
	require.Equal(t, entrypoint.DevTenant, tenant)

	// Through the form.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`#customer`), "Form Alice"),
		chromedp.Click(chromedp.CSS(`#place`)),
		chromedp.WaitVisible(row("Form Alice")),
	))
	// Through the API, from outside the page.
	placeViaAPI(t, srv, "API Bob")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(row("API Bob"))))

	// Restart the server; write while it is down (straight into the
	// database, as another process would).
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
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS(`#status.live`)),
		chromedp.WaitVisible(row("Offline Carol")),
		chromedp.WaitVisible(row("Offline Dan")),
	))
	// Live again after the reconnect.
	placeViaAPI(t, srv, "After Erin")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(row("After Erin"))))

	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#orders tbody tr').length`))
	require.NoError(t, err)
	require.Equal(t, 5, rows, "every order exactly once")
	events, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.getElementById('log').textContent.trim().split('\n').length`))
	require.NoError(t, err)
	require.Equal(t, 5, events, "every event delivered exactly once")
}
