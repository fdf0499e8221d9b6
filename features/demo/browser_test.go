package demo_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
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
	if out, err := exec.Command("go", "build", "-o", binary, "github.com/kumiko-go/kumiko/cmd/kumiko").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kumiko: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// server runs `kumiko serve` in all-in-one mode with KUMIKO_DEV=1 (what
// `make run` does) on a fixed address, so that it can be restarted.
type server struct {
	t    *testing.T
	env  []string
	addr string
	logs *syncBuffer
	cmd  *exec.Cmd
	done chan struct{}
}

func newServer(t *testing.T, dbURL, redisURL string) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	s := &server{t: t, addr: addr, logs: &syncBuffer{}, env: []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"APP_MODE=all-in-one", "KUMIKO_DEV=1", "HTTP_ADDR=" + addr, "WORKER_HTTP_ADDR=127.0.0.1:0",
		"DATABASE_URL=" + dbURL, "REDIS_URL=" + redisURL, "JWT_SECRET=" + jwtSecret,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS=50",
	}}
	t.Cleanup(func() {
		s.stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("server logs:\n%s", s.logs.String())
		}
	})
	return s
}

func (s *server) url() string { return "http://" + s.addr }

// start starts the process and waits until it is ready.
func (s *server) start() {
	s.t.Helper()
	s.cmd = exec.Command(binary, "serve")
	s.cmd.Env = s.env
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	require.NoError(s.t, s.cmd.Start())
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.done)
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
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	<-s.done
	s.cmd = nil
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

// TestDemoPageInBrowser drives the demo page in chromium: an order placed
// through the form appears in the list, one placed through the API appears
// too, and after a server restart the orders written while it was down
// appear once the page has reconnected, each exactly once.
func TestDemoPageInBrowser(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("chromium is required for the browser test (apt-get install chromium; .ci/run installs it): %v", err)
	}
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	srv := newServer(t, db.URL, rds.URL)
	srv.start()

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
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	require.NoError(t, chromedp.Do(browser)) // starts the browser (no timeout on this first call)
	ctx, cancel := context.WithTimeout(browser, 3*wait)
	defer cancel()

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
