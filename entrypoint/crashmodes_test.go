package entrypoint_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// burstOutcome is what one write of a burst got.
type burstOutcome struct {
	customer string
	keyed    bool
	code     int
	err      error
	body     string
}

// TestSIGTERMDuringAWriteBurst: eight clients on keep-alive connections
// write as fast as they can to an api process (half of them with an
// Idempotency-Key) when it gets SIGTERM. Every write answered 2xx is in the
// orders table exactly once; a write that got no answer (refused, or its
// connection closed) is not; the process exits 0.
func TestSIGTERMDuringAWriteBurst(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	p := start(t, "burst", procEnv("api", db.URL, rds.URL, "burst-1"))
	p.waitReady(t)

	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	tok := token(t, "acme")

	var (
		mu       sync.Mutex
		outcomes []burstOutcome
		answered atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				o := burstOutcome{customer: fmt.Sprintf("c%d-%d", w, i), keyed: w%2 == 0}
				b, _ := json.Marshal(map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": o.customer, "amountCents": 1}})
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/api/write", bytes.NewReader(b))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+tok)
				if o.keyed {
					req.Header.Set("Idempotency-Key", "k-"+o.customer)
				}
				resp, err := client.Do(req)
				if err != nil {
					o.err = err
				} else {
					body, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					o.code, o.body, o.err = resp.StatusCode, string(body), rerr
					answered.Add(1)
				}
				cancel()
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
				if o.err != nil && !p.running() {
					return
				}
			}
		})
	}
	deadline := time.Now().Add(wait)
	for answered.Load() < 200 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, p.Signal(syscall.SIGTERM))
	code := p.waitExit(t, wait)
	stop.Store(true)
	wg.Wait()
	require.Equal(t, 0, code)

	counts := ordersPerCustomer(t, db)
	var ok, refused, other int
	for _, o := range outcomes {
		switch {
		case o.err == nil && o.code == http.StatusOK:
			ok++
			require.Equal(t, 1, counts[o.customer], "answered 200 but committed %d times: %s", counts[o.customer], o.customer)
		case o.err != nil:
			refused++
			// Go's client says "server closed idle connection" for a
			// keep-alive connection the server closed before reading it.
			require.True(t, isUnanswered(o.err) || strings.Contains(o.err.Error(), "server closed idle connection"),
				"write %s: %v", o.customer, o.err)
			require.Zero(t, counts[o.customer], "unanswered write committed: %s (%v)", o.customer, o.err)
		default:
			other++
			t.Logf("write %s: %d %s (committed %d)", o.customer, o.code, o.body, counts[o.customer])
			require.Zero(t, counts[o.customer], "write %s answered %d but committed", o.customer, o.code)
		}
	}
	t.Logf("ok %d, unanswered %d, other %d", ok, refused, other)
	require.Equal(t, ok, len(counts), "every committed write was answered 200")
}

// TestSIGKILLedAPIsSSEClientsResumeElsewhere: two api processes and a
// worker; writers write through the second api while SSE clients read from
// the first, which is killed with SIGKILL in the middle of the burst. Each
// client resumes on the second with the id of the last complete event it
// got and ends up with its tenant's log exactly: no gap, no duplicate.
func TestSIGKILLedAPIsSSEClientsResumeElsewhere(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	api1 := start(t, "kill-sse-1", procEnv("api", db.URL, rds.URL, "kill-sse-1"))
	api2 := start(t, "kill-sse-2", procEnv("api", db.URL, rds.URL, "kill-sse-2"))
	w := start(t, "kill-sse-w", procEnv("worker", db.URL, rds.URL, "kill-sse-w"))
	api1.waitReady(t)
	api2.waitReady(t)
	w.waitReady(t)

	var streams []*stream
	for range 4 {
		s, err := openStream(t, api1.url, "acme", "", "")
		require.NoError(t, err)
		streams = append(streams, s)
	}
	done := writeBurst(t, func() string { return api2.url }, "acme", 4, 40)
	streams[0].waitFor(t, 20)
	api1.kill()
	var resumed []*stream
	var before [][]string
	for _, s := range streams {
		err := s.ended(t, 10*time.Second)
		require.Error(t, err)
		got, _ := s.snapshot()
		last := ""
		if len(got) > 0 {
			last = got[len(got)-1].ID
		}
		r, err := openStream(t, api2.url, "acme", "", last)
		require.NoError(t, err)
		resumed = append(resumed, r)
		before = append(before, ids(got))
	}
	done()
	want := tenantLogOf(t, db, "acme", "")
	for i, r := range resumed {
		got := append(before[i], ids(r.waitFor(t, len(want)-len(before[i])))...)
		require.Equal(t, want, got, "client %d", i)
	}
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	for i, r := range resumed {
		evs, _ := r.snapshot()
		require.Len(t, evs, len(want)-len(before[i]), "no duplicate, client %d", i)
	}
}

// TestSIGKILLedOnlyWorkerThenANewOne: an api process takes orders and
// invitations while the only worker runs the order-totals projection and
// the invoice and welcome-mail jobs; the worker is killed with SIGKILL in
// the middle, the writes go on, and a new worker starts. In the end every
// order has one invoice, every invitation one mail, and the totals match
// the orders.
func TestSIGKILLedOnlyWorkerThenANewOne(t *testing.T) {
	t.Parallel()
	testOnlyWorkerReplaced(t, false)
}

// TestSIGTERMedOnlyWorkerThenANewOne is TestSIGKILLedOnlyWorkerThenANewOne
// with a drain: the worker exits 0 and a new one finishes the work.
func TestSIGTERMedOnlyWorkerThenANewOne(t *testing.T) {
	t.Parallel()
	testOnlyWorkerReplaced(t, true)
}

func testOnlyWorkerReplaced(t *testing.T, drain bool) {
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	api := start(t, "killw-api", procEnv("api", db.URL, rds.URL, "killw-api"))
	w1 := start(t, "killw-1", procEnv("worker", db.URL, rds.URL, "killw-1"))
	api.waitReady(t)
	w1.waitReady(t)

	var wg sync.WaitGroup
	var stop atomic.Bool
	var placed atomic.Int64
	errs := make(chan error, 8)
	for wr := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load() && i < 400; i++ {
				var body map[string]any
				if i%3 == 0 {
					body = map[string]any{"type": "users:write:invite", "payload": map[string]any{"email": fmt.Sprintf("u%d-%d@example.com", wr, i)}}
				} else {
					body = map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": fmt.Sprintf("c%d", i%5), "amountCents": 1 + i}}
				}
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				code, b, err := post(ctx, t, api.url+"/api/write", "acme", body)
				cancel()
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("write answered %d: %s", code, b)
				}
				if err != nil {
					errs <- err
					return
				}
				placed.Add(1)
			}
		})
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		var inv int
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM invoices`).Scan(&inv))
		if inv >= 30 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if drain {
		require.NoError(t, w1.Signal(syscall.SIGTERM))
		require.Equal(t, 0, w1.waitExit(t, wait))
	} else {
		w1.kill()
		// What a minute without its heartbeats does: the leases of the
		// runs it was running run out (it may have run none), so the
		// next worker runs them again when it starts.
		rds.ExpireLeases(t)
	}
	time.Sleep(300 * time.Millisecond) // writes go on without a worker
	w2 := start(t, "killw-2", procEnv("worker", db.URL, rds.URL, "killw-2"))
	w2.waitReady(t)
	wg.Wait()
	stop.Store(true)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// A job run the kill cut short runs again once its lease ran out.
	deadline = time.Now().Add(4 * time.Minute)
	for {
		var orders, invoices, dupInv, users, mails, dupMail, totOrders, totAmount, sumAmount int64
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM orders),
			(SELECT count(*) FROM invoices),
			(SELECT count(*) - count(DISTINCT order_id) FROM invoices),
			(SELECT count(*) FROM users),
			(SELECT count(*) FROM sent_mail),
			(SELECT count(*) - count(DISTINCT user_id) FROM sent_mail),
			(SELECT coalesce(sum(orders), 0) FROM order_totals),
			(SELECT coalesce(sum(amount_cents), 0) FROM order_totals),
			(SELECT coalesce(sum(amount_cents), 0) FROM orders)`).
			Scan(&orders, &invoices, &dupInv, &users, &mails, &dupMail, &totOrders, &totAmount, &sumAmount))
		require.Zero(t, dupInv, "an order got two invoices")
		require.Zero(t, dupMail, "a user got two welcome mails")
		require.LessOrEqual(t, totOrders, orders, "the projection counted an order twice")
		require.LessOrEqual(t, mails, users)
		if orders == invoices && users == mails && totOrders == orders && totAmount == sumAmount {
			t.Logf("%d orders, %d users", orders, users)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("orders %d invoices %d, users %d mails %d, totals %d/%d amount %d/%d",
				orders, invoices, users, mails, totOrders, orders, totAmount, sumAmount)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAllBackendsTerminatedForSeconds: an api process and a worker under a
// trickle of writes while, for three seconds, every backend of their
// database is terminated (pg_terminate_backend) every 100 ms. Neither
// process exits; readiness answers within 2 s all along and is 200 again
// soon after; writes succeed again; every write answered 200 is in the log
// once and the projection and the invoice job account for each order
// exactly once.
func TestAllBackendsTerminatedForSeconds(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	api := start(t, "term-api", procEnv("api", db.URL, rds.URL, "term-api"))
	w := start(t, "term-w", procEnv("worker", db.URL, rds.URL, "term-w"))
	api.waitReady(t)
	w.waitReady(t)
	ctx := context.Background()

	var stop atomic.Bool
	var wg sync.WaitGroup
	var okMu sync.Mutex
	okCustomers := map[string]bool{}
	refusedCustomers := map[string]bool{} // answered 503: must not have committed
	for wr := range 3 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				c := fmt.Sprintf("t%d-%d", wr, i)
				cctx, cancel := context.WithTimeout(ctx, wait)
				code, _, err := post(cctx, t, api.url+"/api/write", "acme",
					map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": c, "amountCents": 1}})
				cancel()
				if err == nil && (code == http.StatusOK || code == http.StatusServiceUnavailable) {
					okMu.Lock()
					if code == http.StatusOK {
						okCustomers[c] = true
					} else {
						refusedCustomers[c] = true
					}
					okMu.Unlock()
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	probeSlow := make(chan string, 100)
	wg.Go(func() {
		for !stop.Load() {
			for _, p := range []*proc{api, w} {
				st := time.Now()
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, _, err := get(pctx, p.url+"/health/ready")
				cancel()
				if d := time.Since(st); err != nil || d > 2500*time.Millisecond {
					probeSlow <- fmt.Sprintf("%s: %s %v", p.name, d, err)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	time.Sleep(500 * time.Millisecond)
	end := time.Now().Add(3 * time.Second)
	for time.Now().Before(end) {
		_, err := db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, db.Name)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond)
	}
	api.waitReady(t)
	w.waitReady(t)
	time.Sleep(time.Second) // writes after the outage
	stop.Store(true)
	wg.Wait()
	close(probeSlow)
	for s := range probeSlow {
		t.Errorf("readiness probe: %s", s)
	}
	require.True(t, api.running(), "api exited")
	require.True(t, w.running(), "worker exited")
	api.place(t, "acme", "after")

	deadline := time.Now().Add(3 * time.Minute)
	for {
		counts := ordersPerCustomer(t, db)
		for c := range okCustomers {
			require.Equal(t, 1, counts[c], c)
		}
		for c := range refusedCustomers {
			require.Zero(t, counts[c], "answered 503 but committed: %s", c)
		}
		var orders, invoices, dupInv, totOrders int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM invoices),
			(SELECT count(*) - count(DISTINCT order_id) FROM invoices), (SELECT coalesce(sum(orders), 0) FROM order_totals)`).
			Scan(&orders, &invoices, &dupInv, &totOrders))
		require.Zero(t, dupInv)
		require.LessOrEqual(t, totOrders, orders)
		if invoices == orders && totOrders == orders {
			t.Logf("%d orders (%d answered 200, %d 503)", orders, len(okCustomers), len(refusedCustomers))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orders %d invoices %d totals %d", orders, invoices, totOrders)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A clean stop still works after the outage.
	require.NoError(t, api.Signal(syscall.SIGTERM))
	require.NoError(t, w.Signal(syscall.SIGTERM))
	require.Equal(t, 0, api.waitExit(t, wait))
	require.Equal(t, 0, w.waitExit(t, wait))
}

// ordersPerCustomer counts db's orders by customer (the tests make each
// customer name unique to one write).
func ordersPerCustomer(t *testing.T, db *kumikotest.DB) map[string]int {
	t.Helper()
	counts := map[string]int{}
	rows, err := db.Pool.Query(context.Background(), `SELECT customer FROM orders`)
	require.NoError(t, err)
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		counts[c]++
	}
	require.NoError(t, rows.Err())
	return counts
}
