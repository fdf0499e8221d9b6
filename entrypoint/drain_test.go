package entrypoint_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// blockOrders holds a lock on the orders table that makes every order
// placement wait (EXCLUSIVE mode blocks inserts; it takes no xid, so it does
// not hold back the visibility horizon of other tests). release ends it.
func blockOrders(t *testing.T, db *kumikotest.DB) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `BEGIN; LOCK TABLE orders IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	released := false
	release = func() {
		if released {
			return
		}
		released = true
		_, _ = conn.Exec(ctx, `COMMIT`)
		_ = conn.Close(ctx)
	}
	t.Cleanup(release)
	return release
}

// waitBlocked waits until a session waits for the lock on orders.
func waitBlocked(t *testing.T, db *kumikotest.DB) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_locks WHERE relation = 'orders'::regclass AND NOT granted`).Scan(&n))
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no request is waiting for the orders lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// slowPlace places an order in the background; the result arrives on the
// returned channel.
func slowPlace(t *testing.T, p *proc) <-chan int {
	t.Helper()
	out := make(chan int, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
		defer cancel()
		code, _, err := post(ctx, t, p.url+"/api/write", "acme",
			map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "slow", "amountCents": 1}})
		if err != nil {
			code = -1
		}
		out <- code
	}()
	return out
}

// TestSIGTERMDrains: SIGTERM turns readiness off at once, ends an open SSE
// stream cleanly, lets an in-flight slow request finish (and its events be
// dispatched), and exits 0.
func TestSIGTERMDrains(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	p := start(t, "drain", procEnv("all-in-one", db.URL, rds.URL, "drain-1"))
	p.waitReady(t)

	s, err := openStream(t, p.url, "acme", "", "")
	require.NoError(t, err)
	p.place(t, "acme", "before")
	s.waitFor(t, 1)

	release := blockOrders(t, db)
	result := slowPlace(t, p)
	waitBlocked(t, db)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	// The stream ends cleanly: the chunked body is terminated (io.EOF, not
	// an unexpected EOF), while the slow request is still in flight.
	require.ErrorIs(t, s.ended(t, 5*time.Second), io.EOF)
	// Readiness is off at once: a probe is refused, closed unanswered, or
	// answered 503.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	code, _, err := get(ctx, p.url+"/health/ready")
	cancel()
	if err == nil {
		require.Equal(t, http.StatusServiceUnavailable, code)
	} else {
		require.True(t, isUnanswered(err), "ready probe: %v", err)
	}
	// The in-flight request keeps the process alive.
	time.Sleep(300 * time.Millisecond)
	require.True(t, p.running(), "the process exited with a request in flight")
	release()
	require.Equal(t, http.StatusOK, <-result)
	require.Equal(t, 0, p.waitExit(t, wait))

	logs := p.logs.String()
	require.Contains(t, logs, `"msg":"process draining"`)
	require.Contains(t, logs, `"msg":"process stopped"`)
	require.Less(t, strings.Index(logs, `"msg":"process draining"`), strings.Index(logs, `"msg":"process stopped"`))
	var orders int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&orders))
	require.Equal(t, 2, orders)
}

// TestDrainTimeoutExits1: a request that outlives KUMIKO_DRAIN_TIMEOUT_MS
// makes the process give up draining and exit 1, saying once, on its last
// line, that the drain timed out and what it cut off; the signal that
// started the drain is no "interrupted" command.
func TestDrainTimeoutExits1(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	p := start(t, "drain timeout", procEnv("api", db.URL, rds.URL, "drain-timeout-1", "KUMIKO_DRAIN_TIMEOUT_MS", "500"))
	p.waitReady(t)
	release := blockOrders(t, db)
	result := slowPlace(t, p)
	waitBlocked(t, db)
	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 1, p.waitExit(t, wait))
	require.Less(t, time.Since(start), 5*time.Second)
	logs := p.logs.String()
	require.Contains(t, logs, `"msg":"drain timeout exceeded"`)
	require.NotContains(t, logs, "interrupted")
	var plain []string // what is not a JSON log line: the exit reason
	for line := range strings.Lines(logs) {
		if !strings.HasPrefix(line, "{") {
			plain = append(plain, strings.TrimSpace(line))
		}
	}
	require.Equal(t, []string{"kumiko: entrypoint: drain timeout exceeded after 500ms: " +
		"in-flight requests were still running: their connections were cut, and what they had not committed is rolled back"}, plain)
	release()
	<-result
}

// TestReadinessFollowsPostgres: with Postgres unreachable (a black-holed
// proxy between the process and the server), /health/ready answers 503
// within 2 s, naming the failed checks; when Postgres is back, 200 again.
func TestReadinessFollowsPostgres(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	px := newProxy(t, "127.0.0.1:5432")
	dbURL := strings.Replace(db.URL, "127.0.0.1:5432", px.Addr(), 1)
	require.NotEqual(t, db.URL, dbURL)
	p := start(t, "readiness", procEnv("all-in-one", dbURL, rds.URL, "ready-1"))
	p.waitReady(t)

	probe := func() (int, readiness) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		t0 := time.Now()
		code, body, err := get(ctx, p.url+"/health/ready")
		require.NoError(t, err)
		require.Less(t, time.Since(t0), 2*time.Second, "readiness must answer within 2 s")
		var r readiness
		require.NoError(t, json.Unmarshal(body, &r), string(body))
		return code, r
	}

	px.setDown(true)
	flipped := time.Now()
	for {
		code, r := probe()
		if code == http.StatusServiceUnavailable {
			require.Equal(t, "unavailable", r.Status)
			require.Equal(t, "ready", r.State)
			require.False(t, r.check("database").OK)
			require.NotEmpty(t, r.check("database").Error)
			require.True(t, r.check("redis").OK)
			break
		}
		require.Less(t, time.Since(flipped), 2*time.Second, "readiness still 200 after 2 s without Postgres")
	}
	require.Less(t, time.Since(flipped), 2*time.Second)
	require.True(t, p.running())

	px.setDown(false)
	deadline := time.Now().Add(wait)
	for {
		code, r := probe()
		if code == http.StatusOK {
			require.True(t, r.check("database").OK)
			require.True(t, r.check("migrations").OK)
			break
		}
		require.True(t, time.Now().Before(deadline), "readiness did not come back")
		time.Sleep(50 * time.Millisecond)
	}
	// And the process works again.
	p.place(t, "acme", "after outage")
}

// TestStartsBeforePostgres: a process started while Postgres does not
// answer (a black-holed proxy) keeps running and answers 503 with its
// consumers not registered; once Postgres answers it turns ready and
// works, without a restart.
func TestStartsBeforePostgres(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"worker", "all-in-one"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := kumikotest.NewDB(t)
			rds := jobstest.StartRedis(t)
			px := newProxy(t, "127.0.0.1:5432")
			px.setDown(true)
			dbURL := strings.Replace(db.URL, "127.0.0.1:5432", px.Addr(), 1)
			p := start(t, "early-"+mode, procEnv(mode, dbURL, rds.URL, "early-"+mode))

			// Several connect timeouts (1 s each) and registration retries.
			answered := 0
			for until := time.Now().Add(3 * time.Second); time.Now().Before(until); {
				require.True(t, p.running(), "exited while Postgres did not answer")
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				code, body, err := get(ctx, p.url+"/health/ready")
				cancel()
				if err == nil {
					answered++
					require.Equal(t, http.StatusServiceUnavailable, code, string(body))
					var r readiness
					require.NoError(t, json.Unmarshal(body, &r), string(body))
					require.False(t, r.check("consumers").OK, string(body))
				}
				time.Sleep(100 * time.Millisecond)
			}
			require.Positive(t, answered, "/health/ready never answered while Postgres did not")

			px.setDown(false)
			p.waitReady(t)
			if mode == "all-in-one" {
				p.place(t, "acme", "after a late start")
			}
		})
	}
}

// readiness is the body of /health/ready.
type readiness struct {
	Status string `json:"status"`
	State  string `json:"state"`
	Checks []struct {
		Name      string `json:"name"`
		OK        bool   `json:"ok"`
		LatencyMs int64  `json:"latencyMs"`
		Error     string `json:"error"`
	} `json:"checks"`
}

func (r readiness) check(name string) struct {
	Name      string `json:"name"`
	OK        bool   `json:"ok"`
	LatencyMs int64  `json:"latencyMs"`
	Error     string `json:"error"`
} {
	for _, c := range r.Checks {
		if c.Name == name {
			return c
		}
	}
	panic("no check " + name)
}

// TestStalledClientsAreCutOff: with HTTP_READ_TIMEOUT_MS set, a client
// that stalls in its request body is answered and disconnected, with or
// without a token; an SSE stream outlives the read timeout; and SIGTERM
// with a stalled client connected still drains at once and exits 0.
func TestStalledClientsAreCutOff(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	p := start(t, "read timeout", procEnv("all-in-one", db.URL, rds.URL, "read-timeout-1",
		"HTTP_READ_TIMEOUT_MS", "300", "HTTP_IDLE_TIMEOUT_MS", "300"))
	p.waitReady(t)
	s, err := openStream(t, p.url, "acme", "", "")
	require.NoError(t, err)
	opened := time.Now()

	body := `{"type":"orders:write:place","payload":{"customer":"stalled","amountCents":1}}`
	stall := func(auth string) (net.Conn, *bufio.Reader) {
		conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", strings.TrimPrefix(p.url, "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_, err = fmt.Fprintf(conn, "POST /api/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
			auth, len(body), body[:10])
		require.NoError(t, err)
		require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
		return conn, bufio.NewReader(conn)
	}
	answered := func(r *bufio.Reader, status int) {
		res, err := http.ReadResponse(r, nil)
		require.NoError(t, err, "no answer")
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		require.Equal(t, status, res.StatusCode)
		_, err = r.ReadByte()
		require.ErrorIs(t, err, io.EOF, "the connection stays open")
	}
	_, r := stall("Authorization: Bearer " + token(t, "acme") + "\r\n")
	answered(r, http.StatusBadRequest)
	_, r = stall("")
	answered(r, http.StatusUnauthorized)

	// The stream has been open for more than two read timeouts and still
	// delivers.
	time.Sleep(time.Until(opened.Add(700 * time.Millisecond)))
	p.place(t, "acme", "after")
	require.Equal(t, "orders:event:placed", s.waitFor(t, 1)[0].Type)
	var orders int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE customer = 'stalled'`).Scan(&orders))
	require.Zero(t, orders)

	stall("")
	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.waitExit(t, wait))
	require.Less(t, time.Since(start), 5*time.Second)
}

// TestSecondSignalEndsTheDrain: a second SIGTERM while the drain waits for
// a request ends the process at once, by the signal, as SIGKILL would (the
// write in flight rolls back).
func TestSecondSignalEndsTheDrain(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	p := start(t, "second signal", procEnv("api", db.URL, rds.URL, "second-signal-1"))
	p.waitReady(t)
	release := blockOrders(t, db)
	result := slowPlace(t, p)
	waitBlocked(t, db)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	time.Sleep(300 * time.Millisecond)
	require.True(t, p.running(), "the first signal drains: the request in flight keeps the process")
	start := time.Now()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, -1, p.waitExit(t, wait), "ended by the signal")
	require.Less(t, time.Since(start), 5*time.Second)
	release()
	require.NotEqual(t, http.StatusOK, <-result)
	var orders int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&orders))
	require.Zero(t, orders)
}
