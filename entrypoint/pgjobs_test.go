package entrypoint_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
)

// renderInvoice is the sample orders feature's event job: one invoice per
// orders:event:placed, guarded by HandledOnce.
const renderInvoice = "orders:job:render-invoice"

// TestJobsRideOverADatabaseRestartAndCrash: an api process and a separate
// worker process (the job lane, the job-trigger consumer) run against a
// private Postgres and a private Redis under a trickle of writes, each of
// which triggers orders:job:render-invoice, while the database is
// restarted (fast shutdown) and then crashed (immediate shutdown), each
// time for about a second. Before the restart the test locks the table
// of the job's claims in a prepared transaction, which outlives the
// outage and is rolled back once the database is back and the processes
// recovered: runs are under way (blocked in their transaction) when the
// database goes, fail, are retried while it is away or after it came back
// (blocked again until the rollback), and since the prepared transaction
// holds the visibility horizon back, events committed just before the
// outage are not yet delivered to the job trigger when it comes. Before
// the crash it makes every COMMIT wait for a synchronous standby that
// never comes, until a run's COMMIT and a write's wait: both are durable
// but unanswered when the server crashes, so they count after the
// recovery although their clients got an error. From the outside:
//   - neither process exits or panics;
//   - a run under way failed when the database went, each time, and is
//     retried;
//   - every placed event in the log (every write answered 200 among them,
//     and the write in doubt at the crash) has its invoice, rendered from
//     that event, and one HandledOnce claim; the worker enqueued and completed exactly one run per event,
//     and no run is archived (`kumiko jobs list`), waiting or retrying at
//     the end;
//   - no consumer turned dead and nothing was dead-lettered;
//   - the worker's /health/ready says 503 with the database check failing
//     while the database is away, and 200 again within a few seconds of
//     its return.
func TestJobsRideOverADatabaseRestartAndCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := startPrivatePG(t, "max_prepared_transactions=2")
	rds := jobstest.StartRedis(t)
	api := start(t, "api", procEnv("api", pg.url, rds.URL, "pgjobs-api"))
	worker := start(t, "worker", procEnv("worker", pg.url, rds.URL, "pgjobs-worker"))
	api.waitReady(t)
	worker.waitReady(t)
	alive := func(when string) {
		t.Helper()
		require.True(t, api.running(), "%s: the api process exited with %d", when, api.Code())
		require.True(t, worker.running(), "%s: the worker process exited with %d", when, worker.Code())
	}

	// The trickle of writes (two clients) and the worker's readiness.
	load := startWriteLoad(2, func(c, i int) (writeAnswer, bool) { return placeOnce(t, api.url, c, i, ""), true })
	pr := probeReady(worker.url)
	stopLoad := sync.OnceFunc(func() { load.halt(); pr.stop() })
	defer stopLoad()
	oks := load.oks
	trickle := func(since time.Time) {
		t.Helper()
		time.Sleep(500 * time.Millisecond)
		require.Eventually(t, func() bool { return oks(since) >= 10 }, wait, 10*time.Millisecond)
	}

	// A pool of the test's own, for looking in; its connections die with
	// each outage and are replaced.
	pool, err := pgxpool.New(ctx, pg.url)
	require.NoError(t, err)
	defer pool.Close()
	query := func(q string, args ...any) (int, error) {
		var n int
		err := pool.QueryRow(ctx, q, args...).Scan(&n)
		return n, err
	}
	count := func(q string, args ...any) int {
		t.Helper()
		n, err := query(q, args...)
		require.NoError(t, err, q)
		return n
	}

	in := jobs.NewInspector(rds.Client(t), "")
	retried := func() float64 { return metricValue(t, worker.url, "kumiko_jobs_retried_total", renderInvoice) }

	// Phase 1's lock: block locks the handled table (SHARE: a run cannot
	// claim, and waits before it has a transaction id, so the job trigger
	// goes on) until two runs are blocked on it. Then it prepares the
	// lock's transaction as name: a prepared transaction survives a restart
	// (the server takes its locks again at start), and with its transaction
	// id it holds the visibility horizon back, so it waits until a placed
	// event waits for the job trigger. unblock rolls it back. (Not more
	// runs: every slot of the lane blocked would hold every connection of
	// the worker's pool, which the dispatcher shares.)
	block := func(name string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, pg.url)
		require.NoError(t, err)
		for _, q := range []string{`BEGIN`, `LOCK TABLE handled IN SHARE MODE`} {
			_, err = conn.Exec(ctx, q)
			require.NoError(t, err, q)
		}
		require.Eventually(t, func() bool {
			n, err := query(`SELECT count(*) FROM pg_locks WHERE relation = 'handled'::regclass AND NOT granted`)
			return err == nil && n >= 2
		}, wait, 5*time.Millisecond, "%s: fewer than 2 runs blocked on handled", name)
		_, err = conn.Exec(ctx, `PREPARE TRANSACTION '`+name+`'`)
		require.NoError(t, err)
		require.NoError(t, conn.Close(ctx))
		require.Eventually(t, func() bool {
			n, err := query(`SELECT count(*) FROM events e, event_consumers c
				WHERE c.name = $1 AND e.type = 'orders:event:placed'
				AND (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)`, jobs.ConsumerName)
			return err == nil && n > 0
		}, wait, 10*time.Millisecond, "%s: no placed event waits for the job trigger", name)
	}
	unblock := func(name string) {
		t.Helper()
		_, err := pool.Exec(ctx, `ROLLBACK PREPARED '`+name+`'`)
		require.NoError(t, err)
	}
	// awayFor keeps the database away for a second of trickle and checks
	// that a run under way failed and is to be retried.
	awayFor := func(before float64) func() {
		return func() {
			t.Helper()
			time.Sleep(time.Second)
			alive("while the database was away")
			require.Greater(t, retried(), before, "a run under way failed when the database went and is retried")
		}
	}
	// waitRecovered waits until a write and a worker readiness probe
	// started after o.up answered 200.
	waitRecovered := func(o *outage) {
		t.Helper()
		require.Eventually(t, func() bool {
			return oks(o.up) > 0 && !pr.readyAfter(o.up).IsZero()
		}, outageBound, 20*time.Millisecond, "%s: writes or the worker's readiness did not recover", o.name)
		o.recoveredR = pr.readyAfter(o.up)
	}

	// Warm up: writes flow and invoices are rendered.
	trickle(time.Time{})
	require.Eventually(t, func() bool { n, err := query(`SELECT count(*) FROM invoices`); return err == nil && n > 0 }, wait, 20*time.Millisecond)

	// Phase 1: a restart (fast shutdown) with runs under way, blocked
	// before their claim.
	block("restart")
	restart := pg.takeAway(t, "restart", false, awayFor(retried()))
	waitRecovered(restart)
	unblock("restart")
	trickle(restart.up)

	// Phase 2: a crash (immediate shutdown, crash recovery at start) while
	// commits are in doubt: a synchronous standby that never comes makes
	// every COMMIT wait after it is durable, invisible to others until the
	// wait ends. A run is held after its claim by a lock until the commits
	// wait, then let go: its COMMIT (claim and invoice) waits too, as does
	// a write's (it holds a lock on orders). The crash ends every wait:
	// those commits count after the recovery, although their clients (the
	// run, the write) got an error, and the events of those writes were
	// never delivered before.
	syncRep := func(on bool) {
		t.Helper()
		q := `ALTER SYSTEM RESET synchronous_standby_names`
		if on {
			q = `ALTER SYSTEM SET synchronous_standby_names = 'pgjobs_nowhere'`
		}
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `SELECT pg_reload_conf()`)
		require.NoError(t, err)
	}
	lockConn, err := pgx.Connect(ctx, pg.url)
	require.NoError(t, err)
	for _, q := range []string{`BEGIN`, `LOCK TABLE invoices IN SHARE MODE`} {
		_, err = lockConn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	require.Eventually(t, func() bool {
		n, err := query(`SELECT count(*) FROM pg_locks WHERE relation = 'invoices'::regclass AND NOT granted`)
		return err == nil && n > 0
	}, wait, 10*time.Millisecond, "crash: no run blocked on invoices")
	syncRep(true)
	// The reload takes effect a moment later: once a write's COMMIT waits,
	// the run's will too.
	require.Eventually(t, func() bool {
		n, err := query(`SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
			WHERE a.wait_event = 'SyncRep' AND l.relation = 'orders'::regclass AND l.granted`)
		return err == nil && n > 0
	}, wait, 10*time.Millisecond, "crash: no write's COMMIT waits")
	_, err = lockConn.Exec(ctx, `ROLLBACK`) // no transaction id: no wait
	require.NoError(t, err)
	require.NoError(t, lockConn.Close(ctx))
	require.Eventually(t, func() bool {
		n, err := query(`SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid
			WHERE a.wait_event = 'SyncRep' AND l.relation = 'invoices'::regclass AND l.granted`)
		return err == nil && n > 0
	}, wait, 10*time.Millisecond, "crash: no run's COMMIT waits")
	crash := pg.takeAway(t, "crash", true, awayFor(retried()))
	syncRep(false)
	waitRecovered(crash)
	trickle(crash.up)
	stopLoad()
	writes := load.writes
	alive("after the outages")
	outages := outages{restart, crash}
	for _, o := range outages {
		t.Logf("%s: the worker was ready again %s after the database came back", o.name, o.recoveredR.Sub(o.up).Round(time.Millisecond))
	}

	// Every write was answered; collect those answered 200.
	var placed []string
	for _, a := range writes {
		require.NoError(t, a.err, "write of client %d at %s", a.client, a.start.Format(time.StampMilli))
		if a.code == http.StatusOK {
			placed = append(placed, a.orderID)
		}
	}

	// Every event gets its run; then nothing waits, runs or retries.
	events := count(`SELECT count(*) FROM events WHERE type = 'orders:event:placed'`)
	require.Greater(t, events, len(placed), "a write in doubt at the crash committed")
	require.Eventually(t, func() bool {
		if n, err := query(`SELECT count(*) FROM invoices`); err != nil || n < events {
			return false
		}
		for _, s := range []jobs.State{jobs.StatePending, jobs.StateActive, jobs.StateRetry, jobs.StateScheduled} {
			if runs, err := in.List(ctx, &jobs.ListOptions{State: s}); err != nil || len(runs) > 0 {
				return false
			}
		}
		return true
	}, 3*outageBound, 50*time.Millisecond, "runs left: %d invoices of %d events", count(`SELECT count(*) FROM invoices`), events)

	// Each placed event has one invoice, rendered from it (the number ends
	// in the event's position), and one claim; no invoice or claim without
	// an event; every write answered 200 is among them.
	require.Zero(t, count(`SELECT count(*) FROM events e WHERE e.type = 'orders:event:placed' AND NOT EXISTS (
		SELECT 1 FROM invoices i WHERE i.tenant_id = e.tenant_id AND i.order_id = (e.payload->>'orderId')::uuid
		AND split_part(i.number, '-', 3)::bigint = e.position AND i.customer = e.payload->>'customer'
		AND i.amount_cents = (e.payload->>'amountCents')::bigint)`), "events without their invoice")
	require.Equal(t, events, count(`SELECT count(*) FROM invoices`), "invoices")
	require.Equal(t, events, count(`SELECT count(*) FROM handled h WHERE h.key LIKE 'render-invoice:%' AND EXISTS (
		SELECT 1 FROM events e WHERE e.type = 'orders:event:placed' AND e.tenant_id = h.tenant_id
		AND h.key = 'render-invoice:' || (e.payload->>'orderId'))`), "claims of placed events")
	require.Equal(t, events, count(`SELECT count(*) FROM handled`), "claims")
	require.Zero(t, count(`SELECT count(*) FROM unnest($1::uuid[]) AS p(id) WHERE NOT EXISTS (
		SELECT 1 FROM invoices i WHERE i.order_id = p.id)`, placed), "writes answered 200 without an invoice")

	// One run per event, each completed once: none enqueued twice, none
	// archived, and some retried (those under way at the outages).
	require.InDelta(t, float64(events), metricValue(t, worker.url, "kumiko_jobs_enqueued_total", renderInvoice), 0, "runs enqueued")
	require.InDelta(t, float64(events), metricValue(t, worker.url, "kumiko_jobs_succeeded_total", renderInvoice), 0, "runs succeeded")
	require.Zero(t, metricValue(t, worker.url, "kumiko_jobs_archived_total", renderInvoice), "runs archived")
	require.Equal(t, metricValue(t, worker.url, "kumiko_jobs_failed_total", renderInvoice), retried(), "every failed run was retried")
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "REDIS_URL=" + rds.URL, "DATABASE_URL=" + pg.url}
	require.Empty(t, jobsList(t, env, "archived"), "archived runs")
	completed := map[string]int{}
	maxRetried := 0
	for _, r := range jobsList(t, env, "completed") {
		if r.Job == renderInvoice {
			completed[r.ID]++
			maxRetried = max(maxRetried, r.Retried)
		}
	}
	require.Len(t, completed, events, "completed runs")
	t.Logf("%d writes, %d answered 200, %d events, each with its invoice; %.0f failed runs retried, at most %d times one run",
		len(writes), len(placed), events, retried(), maxRetried)

	// No consumer turned dead, nothing was dead-lettered.
	require.Zero(t, count(`SELECT count(*) FROM event_consumers WHERE status <> 'idle'`), "consumers not idle")
	require.Zero(t, count(`SELECT count(*) FROM event_dead_letters`), "dead letters")

	// The worker said it was not ready while the database was away.
	requireNotReadyWhileAway(t, "worker", pr.answers(), outages)
	alive("at the end")
	for _, p := range []*proc{api, worker} {
		require.NotContains(t, p.logs.String(), "panic", p.name)
	}
	require.NotContains(t, worker.logs.String(), "job archived")
}

// metricValue returns the value of name{job=job,lane="worker"} on base's
// /metrics, 0 when it is not there.
func metricValue(t *testing.T, base, name, job string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), outageBound)
	defer cancel()
	code, body, err := get(ctx, base+"/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	prefix := name + `{job="` + job + `",lane="worker"} `
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, sc.Text())
			return f
		}
	}
	require.NoError(t, sc.Err())
	return 0
}

// jobsList runs `kumiko jobs list --state state --json --limit 1000`
// with env and returns the runs it lists.
func jobsList(t *testing.T, env []string, state string) []jobs.TaskInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "jobs", "list", "--state", state, "--json", "--limit", "1000")
	cmd.Env = env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, stderr.String())
	var runs []jobs.TaskInfo
	require.NoError(t, json.Unmarshal(out, &runs), string(out))
	require.Less(t, len(runs), 1000, "more runs than one list shows")
	return runs
}
