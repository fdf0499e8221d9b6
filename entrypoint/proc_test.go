package entrypoint_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// wait bounds every "eventually" of these tests: the visibility horizon is
// cluster-wide, so other tests' transactions delay delivery.
const wait = 30 * time.Second

// jwtSecret is the JWT_SECRET of every process the tests start.
const jwtSecret = "entrypoint-test-secret-0123456789abcdef"

// keyring verifies and mints tokens of jwtSecret.
func keyring(t *testing.T) *auth.Keyring {
	t.Helper()
	ck, err := config.ParseJWTKeys(jwtSecret)
	require.NoError(t, err)
	keys := make([]auth.Key, len(ck))
	for i, k := range ck {
		keys[i] = auth.Key{ID: k.ID, Secret: k.Secret}
	}
	ring, err := auth.NewKeyring(keys)
	require.NoError(t, err)
	return ring
}

// token mints a token of user u-<tenant> of tenant.
func token(t *testing.T, tenant string) string {
	t.Helper()
	tok, err := keyring(t).Mint(auth.Principal{UserID: "u-" + tenant, TenantID: tenant}, time.Hour)
	require.NoError(t, err)
	return tok
}

// proc is one kumiko process.
type proc struct {
	*proctest.Proc
	name string
	cmd  *exec.Cmd
	url  string // base URL of its HTTP server (health server for a worker)
	logs *proctest.Buffer
}

// procEnv is the environment of a process: mode, database, Redis and
// instance id; HTTP_ADDR and WORKER_HTTP_ADDR get free ports unless set.
func procEnv(mode, dbURL, redisURL, instance string, extra ...string) map[string]string {
	env := map[string]string{
		"APP_MODE":                           mode,
		"DATABASE_URL":                       dbURL,
		"REDIS_URL":                          redisURL,
		"JWT_SECRET":                         jwtSecret,
		"KUMIKO_INSTANCE_ID":                 instance,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "50",
		"DATABASE_POOL_CONNECT_TIMEOUT":      "1s",
		"LOG_LEVEL":                          "debug",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

// start runs `kumiko <args>` (default: serve) with env and stops it with
// SIGKILL when the test ends if it is still running.
func start(t *testing.T, name string, env map[string]string, args ...string) *proc {
	t.Helper()
	if len(args) == 0 {
		args = []string{"serve"}
	}
	if env["HTTP_ADDR"] == "" {
		env["HTTP_ADDR"] = proctest.FreeAddr(t)
	}
	if env["WORKER_HTTP_ADDR"] == "" {
		env["WORKER_HTTP_ADDR"] = proctest.FreeAddr(t)
	}
	pp := proctest.Start(t, binary, name, env, args...)
	p := &proc{Proc: pp, name: name, cmd: pp.Cmd, logs: pp.Output}
	p.url = "http://" + env["HTTP_ADDR"]
	if env["APP_MODE"] == "worker" {
		p.url = "http://" + env["WORKER_HTTP_ADDR"]
	}
	return p
}

// kill stops the process with SIGKILL and waits for it.
func (p *proc) kill() { p.Kill() }

// running reports whether the process has not exited.
func (p *proc) running() bool { return p.Alive() }

// waitExit waits for the process to exit and returns its exit code.
func (p *proc) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	return p.WaitExit(t, timeout)
}

// httpClient is a client that never reuses connections, so that no idle
// connection goroutine outlives a test.
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// get returns the status and body of GET url.
func get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// waitReady waits until /health/ready answers 200.
func (p *proc) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		if !p.running() {
			t.Fatalf("%s exited with %d while starting", p.name, p.Code())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		code, _, err := get(ctx, p.url+"/health/ready")
		cancel()
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready: %d %v", p.name, code, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// post sends a JSON body with tenant's token (and the headers given as
// name, value pairs) and returns status and body.
func post(ctx context.Context, t *testing.T, url, tenant string, body any, headers ...string) (int, []byte, error) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token(t, tenant))
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// place places an order through p's API and returns the order id.
func (p *proc) place(t *testing.T, tenant, customer string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	code, body, err := post(ctx, t, p.url+"/api/write", tenant,
		map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": customer, "amountCents": 100}})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, string(body))
	var res struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(body, &res))
	return res.Data.ID
}

// stream is an SSE client reading in the background.
type stream struct {
	resp   *http.Response
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	events []sse.Event
	err    error
}

// openStream connects to url's /api/sse as tenant, resuming after lastID
// when it is set. It returns an error when the server does not answer 200.
func openStream(t *testing.T, base, tenant, query, lastID string) (*stream, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+sse.Path+"?"+query, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token(t, tenant))
	if lastID != "" {
		req.Header.Set(sse.HeaderLastEventID, lastID)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("stream answered %d: %s", resp.StatusCode, body)
	}
	s := &stream{resp: resp, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		rd := sse.NewReader(resp.Body)
		if ev, err := rd.Next(); err != nil || ev.Type != sse.OpenEvent {
			s.mu.Lock()
			s.err = fmt.Errorf("no opening frame: %s, %w", ev.Type, err)
			s.mu.Unlock()
			return
		}
		for {
			ev, err := rd.Next()
			s.mu.Lock()
			if err != nil {
				s.err = err
				s.mu.Unlock()
				return
			}
			s.events = append(s.events, ev)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.close)
	return s, nil
}

func (s *stream) close() {
	s.cancel()
	s.resp.Body.Close()
	<-s.done
}

func (s *stream) snapshot() ([]sse.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sse.Event(nil), s.events...), s.err
}

// waitFor waits until the stream has n events.
func (s *stream) waitFor(t *testing.T, n int) []sse.Event {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		evs, err := s.snapshot()
		if len(evs) >= n {
			return evs
		}
		if err != nil {
			t.Fatalf("stream ended after %d events (want %d): %v", len(evs), n, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream has %d events, want %d", len(evs), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ended waits until the stream's body ended and returns how.
func (s *stream) ended(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-s.done:
		_, err := s.snapshot()
		return err
	case <-time.After(timeout):
		t.Fatalf("stream still open after %s", timeout)
		return nil
	}
}

func ids(evs []sse.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// isUnanswered reports whether err means the server took no request: the
// connection was refused, or it was accepted into the backlog of a listener
// closing for shutdown and closed without a response (EOF or a reset).
func isUnanswered(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}
