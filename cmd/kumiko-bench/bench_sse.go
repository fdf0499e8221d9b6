package main

// SSE benchmarks (framework/sse): commit → client latency at a steady rate,
// and fan-out of a burst to 10k clients of one API process. Helper names
// start with "sse".

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/sse"
)

func init() {
	register(Bench{Name: "sse-latency", Run: benchSSELatency})
	register(Bench{Name: "sse-fanout", Run: benchSSEFanout})
}

// sseSecret is the JWT secret of the benchmarks' API processes.
const sseSecret = "bench-sse-secret-0123456789abcdef0123"

// sseKeyring returns the keyring of sseSecret.
func sseKeyring() (*auth.Keyring, error) {
	ck, err := config.ParseJWTKeys(sseSecret)
	if err != nil {
		return nil, err
	}
	return auth.NewKeyring([]auth.Key{{ID: ck[0].ID, Secret: ck[0].Secret}})
}

// sseRedisURL is the Redis the API processes use (readiness and
// idempotency only: an API process consumes no job lane).
func sseRedisURL() string {
	if u := os.Getenv("REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// benchSSELatency: an API process (in-process, APP_MODE=api) with one SSE
// client; orders are placed through POST /api/write at 200/s, one at a
// time. Each event's latency runs from its commit (the runtime's OnCommit,
// first thing after COMMIT returned) to the client having parsed its frame.
// The baseline is the write's own HTTP round trip in the same run.
func benchSSELatency(ctx context.Context, env *Env) ([]Result, error) {
	const rate = 200
	dur := 15 * time.Second
	if env.Quick {
		dur = 3 * time.Second
	}
	db, drop, err := kumikotest.CreateDB(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	cfg, err := config.FromLookup(func(k string) (string, bool) {
		v, ok := map[string]string{
			"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": sseRedisURL(), "JWT_SECRET": sseSecret,
			"KUMIKO_INSTANCE_ID": "bench-sse-latency", "LOG_LEVEL": "warn",
		}[k]
		return v, ok
	})
	if err != nil {
		return nil, err
	}
	app, err := entrypoint.New(ctx, entrypoint.Options{Config: cfg, Register: features.Register})
	if err != nil {
		return nil, err
	}
	var (
		mu        sync.Mutex
		current   string
		committed = map[string]time.Time{}
		received  = map[string]time.Time{}
	)
	app.Runtime().OnCommit(func(int) {
		now := time.Now()
		mu.Lock()
		committed[current] = now
		mu.Unlock()
	})
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	base := "http://" + ln.Addr().String()
	runCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- app.Serve(runCtx, ln) }()
	defer func() { stop(); <-served }()
	if err := sseWaitReady(ctx, base); err != nil {
		return nil, err
	}
	keys, err := sseKeyring()
	if err != nil {
		return nil, err
	}
	tok, err := keys.Mint(auth.Principal{UserID: "bench", TenantID: "bench"}, time.Hour)
	if err != nil {
		return nil, err
	}

	// The client.
	req, err := http.NewRequestWithContext(runCtx, http.MethodGet, base+sse.Path+"?types=orders:event:placed", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("sse answered %d", resp.StatusCode)
	}
	go func() {
		rd := sse.NewReader(resp.Body)
		for {
			ev, err := rd.Next()
			if err != nil {
				return
			}
			now := time.Now()
			var d struct {
				Payload orderPlaced `json:"payload"`
			}
			if json.Unmarshal(ev.Data, &d) == nil {
				mu.Lock()
				received[d.Payload.Customer] = now
				mu.Unlock()
			}
		}
	}()

	// The writer: one write at a time, paced at rate.
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var roundTrips []time.Duration
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	end := time.Now().Add(dur)
	n := 0
	for time.Now().Before(end) {
		<-tick.C
		key := "c-" + strconv.Itoa(n)
		n++
		mu.Lock()
		current = key
		mu.Unlock()
		t0 := time.Now()
		if err := ssePlace(ctx, client, base, tok, key); err != nil {
			return nil, err
		}
		roundTrips = append(roundTrips, time.Since(t0))
	}
	// Wait for the stragglers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := len(received)
		mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	var lat []time.Duration
	for k, c := range committed {
		if r, ok := received[k]; ok {
			lat = append(lat, r.Sub(c))
		}
	}
	missing := n - len(received)
	mu.Unlock()
	if missing > 0 {
		return nil, fmt.Errorf("%d of %d events never reached the client", missing, n)
	}
	p50, p99 := quantile(lat, 0.50), quantile(lat, 0.99)
	rt50, rt99 := quantile(roundTrips, 0.50), quantile(roundTrips, 0.99)
	fmt.Fprintf(os.Stderr, "   %d events at %d/s: commit→client p50 %s, p90 %s, p95 %s, p99 %s, max %s; write round trip p50 %s, p99 %s\n",
		len(lat), rate, p50, quantile(lat, 0.90), quantile(lat, 0.95), p99, quantile(lat, 1), rt50, rt99)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return []Result{
		{Name: "commit→SSE client p50 at 200 events/s", Value: ms(p50), Unit: "ms",
			Baseline: "POST /api/write round trip p50", BaselineValue: ms(rt50), Target: "<= 10 ms", Pass: p50 <= 10*time.Millisecond},
		{Name: "commit→SSE client p99 at 200 events/s", Value: ms(p99), Unit: "ms",
			Baseline: "POST /api/write round trip p99", BaselineValue: ms(rt99), Target: "<= 50 ms", Pass: p99 <= 50*time.Millisecond},
	}, nil
}

// orderPlaced is the part of orders:event:placed the benchmarks read.
type orderPlaced struct {
	Customer string `json:"customer"`
}

// ssePlace places one order for customer through POST /api/write.
func ssePlace(ctx context.Context, client *http.Client, base, tok, customer string) error {
	body := fmt.Sprintf(`{"type":"orders:write:place","payload":{"customer":%q,"amountCents":100}}`, customer)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/write", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("write answered %d: %s", resp.StatusCode, buf.String())
	}
	return nil
}

// sseWaitReady waits until base's /health/ready answers 200.
func sseWaitReady(ctx context.Context, base string) error {
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(60 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health/ready", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready: %v", base, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sseRSS returns the resident set size of process pid in bytes.
func sseRSS(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// benchSSEFanout: 10k SSE clients on one API process (the real binary,
// APP_MODE=api, as a separate process so that its memory is its own), then
// a burst of 100 events (one POST /api/batch of 100 orders). It reports the
// process's RSS with every client connected and after the burst (the
// baseline: its RSS before any client), and the time from the batch's
// commit (its response) to the last client having all 100 events.
func benchSSEFanout(ctx context.Context, env *Env) ([]Result, error) {
	clients, burst := 10_000, 100
	if env.Quick {
		clients = 1000
	}
	dir, err := os.MkdirTemp("", "kumiko-bench-sse-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "kumiko")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/kumiko-go/kumiko/cmd/kumiko").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build kumiko: %w\n%s", err, out)
	}
	db, drop, err := kumikotest.CreateDB(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cmd := exec.Command(bin, "serve")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "APP_MODE=api", "HTTP_ADDR=" + addr, "DATABASE_URL=" + db.URL,
		"REDIS_URL=" + sseRedisURL(), "JWT_SECRET=" + sseSecret, "KUMIKO_INSTANCE_ID=bench-sse-fanout", "LOG_LEVEL=warn"}
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	base := "http://" + addr
	if err := sseWaitReady(ctx, base); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, logs.String())
	}
	idle, err := sseRSS(cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	keys, err := sseKeyring()
	if err != nil {
		return nil, err
	}
	tok, err := keys.Mint(auth.Principal{UserID: "bench", TenantID: "bench"}, time.Hour)
	if err != nil {
		return nil, err
	}

	// Connect the clients: raw connections, each counting event frames.
	var (
		connected atomic.Int64
		complete  atomic.Int64
		lastDone  atomic.Int64 // unix nanos of the latest completion
		wg        sync.WaitGroup
		conns     = make([]net.Conn, clients)
	)
	allDone := make(chan struct{})
	request := "GET " + sse.Path + "?types=orders:event:placed HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer " + tok + "\r\n\r\n"
	dialStart := time.Now()
	sem := make(chan struct{}, 64)
	var dialErr error
	var dialMu sync.Mutex
	for i := range clients {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", addr, 30*time.Second)
			if err == nil {
				_, err = c.Write([]byte(request))
			}
			if err != nil {
				dialMu.Lock()
				dialErr = err
				dialMu.Unlock()
				return
			}
			conns[i] = c
			br := bufio.NewReaderSize(c, 4096)
			status, err := br.ReadString('\n')
			if err != nil || !strings.Contains(status, " 200 ") {
				dialMu.Lock()
				dialErr = fmt.Errorf("client %d: %q %v", i, status, err)
				dialMu.Unlock()
				return
			}
			// Skip the headers; the body is chunked.
			for {
				h, err := br.ReadSlice('\n')
				if err != nil {
					dialMu.Lock()
					dialErr = fmt.Errorf("client %d: headers: %w", i, err)
					dialMu.Unlock()
					return
				}
				if len(bytes.TrimSpace(h)) == 0 {
					break
				}
			}
			connected.Add(1)
			go sseCount(bufio.NewReaderSize(httputil.NewChunkedReader(br), 4096), burst, func() {
				lastDone.Store(time.Now().UnixNano())
				if complete.Add(1) == int64(clients) {
					close(allDone)
				}
			})
		})
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	if dialErr != nil {
		return nil, fmt.Errorf("connect clients: %w", dialErr)
	}
	fmt.Fprintf(os.Stderr, "   %d clients connected in %s\n", connected.Load(), time.Since(dialStart).Round(time.Millisecond))
	// Wait until the server counts them all (the handler subscribed).
	if err := sseWaitClients(ctx, base, clients); err != nil {
		return nil, err
	}
	withClients, err := sseRSS(cmd.Process.Pid)
	if err != nil {
		return nil, err
	}

	cpu0, _ := sseCPU(cmd.Process.Pid)
	self0, _ := sseCPU(os.Getpid())
	// The burst: one batch of 100 orders, one commit.
	cmds := make([]string, burst)
	for i := range cmds {
		cmds[i] = fmt.Sprintf(`{"type":"orders:write:place","payload":{"customer":"burst-%d","amountCents":1}}`, i)
	}
	body := `{"commands":[` + strings.Join(cmds, ",") + `]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/batch", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	committed := time.Now()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("batch answered %d", resp.StatusCode)
	}
	select {
	case <-allDone:
	case <-time.After(2 * time.Minute):
		return nil, fmt.Errorf("only %d of %d clients got all %d events", complete.Load(), clients, burst)
	}
	delivery := time.Unix(0, lastDone.Load()).Sub(committed)
	cpu1, _ := sseCPU(cmd.Process.Pid)
	self1, _ := sseCPU(os.Getpid())
	fmt.Fprintf(os.Stderr, "   CPU during the burst: server %s, clients (this process) %s\n", cpu1-cpu0, self1-self0)
	afterBurst, err := sseRSS(cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	peak := max(withClients, afterBurst)
	mb := func(b float64) float64 { return b / (1 << 20) }
	fmt.Fprintf(os.Stderr, "   RSS idle %.0f MB, with %d clients %.0f MB, after the burst %.0f MB; burst of %d delivered to all in %s\n",
		mb(idle), clients, mb(withClients), mb(afterBurst), burst, delivery.Round(time.Millisecond))
	label := strconv.Itoa(clients/1000) + "k"
	return []Result{
		{Name: "API process RSS with " + label + " SSE clients", Value: mb(peak), Unit: "MB",
			Baseline: "RSS before any client", BaselineValue: mb(idle), Target: "<= 500 MB", Pass: mb(peak) <= 500},
		{Name: "burst of 100 events to all " + label + " clients (commit→last receipt)", Value: float64(delivery.Milliseconds()), Unit: "ms",
			Target: "reported", Pass: true},
	}, nil
}

// sseCount reads an SSE stream and calls done once it has n event frames.
func sseCount(br *bufio.Reader, n int, done func()) {
	seen := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
		if bytes.HasPrefix(line, []byte("event: ")) {
			seen++
			if seen == n {
				done()
			}
		}
	}
}

// sseWaitClients waits until the server's kumiko_sse_clients gauge reaches
// n.
func sseWaitClients(ctx context.Context, base string, n int) error {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(resp.Body)
			resp.Body.Close()
			for line := range strings.SplitSeq(buf.String(), "\n") {
				if v, ok := strings.CutPrefix(line, "kumiko_sse_clients "); ok {
					if f, _ := strconv.ParseFloat(v, 64); int(f) >= n {
						return nil
					}
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server did not count %d clients", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sseCPU returns the CPU time (user + system) process pid has used.
func sseCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The fields after the command name (which may contain spaces).
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	if len(f) < 13 {
		return 0, errors.New("short stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil // USER_HZ is 100 on Linux
}
