package entrypoint_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
)

// writeAnswer is what one POST /api/write got.
type writeAnswer struct {
	client        int
	key           string
	start, end    time.Time
	code          int
	body          []byte
	err           error
	orderID       string
	errorCode     string
	requestID     string
	envelopeState string // "" when the body is a well-formed envelope
}

// TestProcessRidesOverADatabaseRestartAndCrash: one all-in-one process
// runs against a private Postgres under a steady trickle of writes from
// three clients (one keyed, retrying a 503 under the same key) while the
// database is restarted (fast shutdown, about a second away) and then
// crashed (immediate shutdown: the next start runs crash recovery), each
// time on the same port. From the outside:
//   - the process never exits or panics; every write is answered within a
//     few seconds, during the outage with 503 unavailable in the error
//     envelope (a write under way when the server was told to go may be
//     500 internal: its COMMIT may have gone out, see the README's error
//     table), and writes succeed again within a few seconds of the
//     database's return;
//   - /health/ready answers 503 while the database is away and 200 again
//     after;
//   - every write answered 200 is in the log exactly once (a keyed one
//     also after its 503 retries), and the order
//     totals projection equals what the log says (nothing lost or applied
//     twice, also of what committed just before the crash);
//   - an SSE client that stayed connected over the restart got every event,
//     and one that reconnects with its Last-Event-ID after the crash gets
//     every event after it, in log order, with no gap or duplicate.
func TestProcessRidesOverADatabaseRestartAndCrash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := startPrivatePG(t)
	dbURL := pg.url
	rds := jobstest.StartRedis(t)
	p := start(t, "all-in-one", procEnv("all-in-one", dbURL, rds.URL, "pgrestart"))
	p.waitReady(t)

	s1, err := openStream(t, p.url, "acme", "types=orders:event:placed", "")
	require.NoError(t, err)

	// The trickle of writes and the readiness prober.
	load := startWriteLoad(3, func(c, i int) (writeAnswer, bool) {
		// Client 2 sends an Idempotency-Key and retries a write refused
		// with 503 under the same key.
		key := ""
		if c == 2 {
			key = fmt.Sprintf("pgrestart-%d", i)
		}
		a := placeOnce(t, p.url, c, i, key)
		return a, key == "" || a.code != http.StatusServiceUnavailable
	})
	pr := probeReady(p.url)
	stopLoad := sync.OnceFunc(func() { load.halt(); pr.stop() })
	defer stopLoad()
	oks := load.oks
	// waitRecovered waits until a write and a readiness probe started
	// after o.up have answered 200, and records when.
	waitRecovered := func(o *outage) {
		t.Helper()
		deadline := o.up.Add(outageBound)
		for {
			for _, a := range load.answers() {
				if a.code == http.StatusOK && a.start.After(o.up) && (o.recoveredW.IsZero() || a.end.Before(o.recoveredW)) {
					o.recoveredW = a.end
				}
			}
			o.recoveredR = pr.readyAfter(o.up)
			if !o.recoveredW.IsZero() && !o.recoveredR.IsZero() {
				return
			}
			if !p.running() {
				t.Fatalf("%s: the process exited with %d", o.name, p.Code())
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s after the database came back, a write recovered at %v and readiness at %v (zero: not yet)",
					o.name, outageBound, o.recoveredW, o.recoveredR)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// awayFor keeps the database away for a second of trickle, with
	// readiness probed meanwhile.
	awayFor := func() {
		t.Helper()
		time.Sleep(time.Second)
		require.True(t, p.running(), "the process exited with %d while the database was away", p.Code())
	}

	// trickle lets writes flow for half a second, at least 20 of them
	// succeeding after since: the log has events committed just before the
	// next outage, some maybe not yet delivered when it comes.
	trickle := func(since time.Time) {
		t.Helper()
		time.Sleep(500 * time.Millisecond)
		require.Eventually(t, func() bool { return oks(since) >= 20 }, wait, 10*time.Millisecond)
	}

	// Warm up: writes flow.
	trickle(time.Time{})

	// Phase 1: a restart (fast shutdown).
	restart := pg.takeAway(t, "restart", false, awayFor)
	waitRecovered(restart)
	trickle(restart.up)

	// The live stream stayed connected over the restart; the client drops
	// it now and reconnects after the crash.
	evs1, err := s1.snapshot()
	require.NoError(t, err, "the live stream ended over the restart")
	require.NotEmpty(t, evs1)
	s1.close()
	lastID := evs1[len(evs1)-1].ID

	// Phase 2: a crash (immediate shutdown, crash recovery at start).
	crash := pg.takeAway(t, "crash", true, awayFor)
	waitRecovered(crash)
	trickle(crash.up)
	stopLoad()
	writes := load.writes
	require.True(t, p.running(), "the process exited with %d", p.Code())

	outages := outages{restart, crash}
	for _, o := range outages {
		t.Logf("%s: writes recovered %s and readiness %s after the database came back",
			o.name, o.recoveredW.Sub(o.up).Round(time.Millisecond), o.recoveredR.Sub(o.up).Round(time.Millisecond))
	}
	during, inFlight := outages.during, outages.inFlight
	inDoubt := 0

	// Every write was answered in time, 200 or a 503 in the envelope; the
	// ones made while the database was away were refused.
	var placed []string
	refused := map[string]int{}
	for _, a := range writes {
		require.NoError(t, a.err, "write of client %d at %s", a.client, a.start.Format(time.StampMilli))
		took := a.end.Sub(a.start)
		require.Less(t, took, outageBound, "a write took %s (%d %s)", took, a.code, a.body)
		if a.code == http.StatusOK {
			require.Nil(t, during(a.start, a.end), "a write succeeded while the database was away: %s", a.body)
			placed = append(placed, a.orderID)
			continue
		}
		require.Empty(t, a.envelopeState, "%d %s", a.code, a.body)
		if a.code == http.StatusInternalServerError && inFlight(a.start, a.end) != nil {
			// It was under way while the server went, its COMMIT maybe
			// sent: whether it committed is unknown, so it is no 503
			// (which says nothing committed). A write that began after the
			// server was gone found its connection ended and is a 503.
			require.Equal(t, "internal", a.errorCode, "%s", a.body)
			inDoubt++
			for _, line := range strings.Split(p.logs.String(), "\n") {
				if strings.Contains(line, a.requestID) && strings.Contains(line, `"error"`) {
					t.Logf("in doubt: %s", line)
				}
			}
			continue
		}
		require.Equal(t, http.StatusServiceUnavailable, a.code, "a write answered %d %s", a.code, a.body)
		require.Equal(t, "unavailable", a.errorCode, "%s", a.body)
		if o := during(a.start, a.end); o != nil {
			refused[o.name]++
		}
	}
	for _, o := range outages {
		require.Positive(t, refused[o.name], "%s: no write was made while the database was away", o.name)
	}

	// Readiness said 503 while the database was away, each answer in time.
	requireNotReadyWhileAway(t, "all-in-one", pr.answers(), outages)

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()

	// Every write answered 200 is in the log exactly once (and its row in
	// orders); no order has two events.
	perOrder := map[string]int{}
	rows, err := pool.Query(ctx, `SELECT payload->>'orderId' FROM events WHERE type = 'orders:event:placed'`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		perOrder[id]++
	}
	require.NoError(t, rows.Err())
	for id, n := range perOrder {
		require.Equal(t, 1, n, "order %s has %d placed events", id, n)
	}
	for _, id := range placed {
		require.Equal(t, 1, perOrder[id], "order %s was answered 200 but is not in the log", id)
	}
	// A keyed write refused with 503 released its key: its retry ran, and
	// each key has one event at most.
	perKey := map[string]int{}
	rows, err = pool.Query(ctx, `SELECT metadata->>'idempotencyKey', count(*) FROM events
		WHERE type = 'orders:event:placed' AND metadata ? 'idempotencyKey' GROUP BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var key string
		var n int
		require.NoError(t, rows.Scan(&key, &n))
		require.Equal(t, 1, n, "key %s has %d events", key, n)
		perKey[key] = n
	}
	require.NoError(t, rows.Err())
	keyedOK := 0
	for _, a := range writes {
		if a.key != "" && a.code == http.StatusOK {
			require.Equal(t, 1, perKey[a.key], "keyed write %s answered 200", a.key)
			keyedOK++
		}
	}
	require.Positive(t, keyedOK)
	var orders int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders))
	require.Len(t, perOrder, orders, "orders rows and placed events")
	t.Logf("%d writes: %d answered 200, %d events in the log; refused while away: %v; in doubt: %d",
		len(writes), len(placed), len(perOrder), refused, inDoubt)

	// The projection caught up with exactly what the log says.
	const fromLog = `SELECT tenant_id || '/' || customer || ': ' || count(*) || ' orders, ' || sum(amount) FROM (
		SELECT tenant_id, payload->>'customer' AS customer, (payload->>'amountCents')::bigint AS amount
		FROM events WHERE type = 'orders:event:placed') AS e GROUP BY tenant_id, customer ORDER BY 1`
	const fromTotals = `SELECT tenant_id || '/' || customer || ': ' || orders || ' orders, ' || amount_cents FROM order_totals ORDER BY 1`
	lines := func(q string) []string {
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT string_agg(x, E'\n') FROM (%s) AS l(x)`, q))
		require.NoError(t, err)
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s *string
			require.NoError(t, rows.Scan(&s))
			if s != nil {
				out = append(out, *s)
			}
		}
		require.NoError(t, rows.Err())
		return out
	}
	want := lines(fromLog)
	require.NotEmpty(t, want)
	deadline := time.Now().Add(wait)
	for {
		got := lines(fromTotals)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			break
		}
		if time.Now().After(deadline) {
			require.Equal(t, want, got, "order totals against the log")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// No consumer turned dead over the outages.
	var notIdle []string
	rows, err = pool.Query(ctx, `SELECT name || '/' || instance_id || ': ' || status FROM event_consumers WHERE status <> 'idle'`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		notIdle = append(notIdle, s)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, notIdle)

	// The log's order of acme's placed events, as SSE ids.
	var logIDs []string
	rows, err = pool.Query(ctx, `SELECT commit_key::text || '-' || position FROM events
		WHERE type = 'orders:event:placed' AND tenant_id = 'acme' ORDER BY commit_key, position`)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		logIDs = append(logIDs, id)
	}
	require.NoError(t, rows.Err())

	// The first stream, open from before the first write to after the
	// restart, got every event up to its last, in order.
	require.Equal(t, logIDs[:len(evs1)], ids(evs1), "the live stream over the restart")
	// The reconnect after the crash replays everything after its last id
	// and goes on live.
	var s2 *stream
	require.Eventually(t, func() bool {
		s2, err = openStream(t, p.url, "acme", "types=orders:event:placed", lastID)
		return err == nil
	}, outageBound, 50*time.Millisecond, "resume after the crash: %v", err)
	rest := logIDs[len(evs1):]
	s2.waitFor(t, len(rest))
	time.Sleep(100 * time.Millisecond) // nothing more arrives: no duplicates
	evs2, err := s2.snapshot()
	require.NoError(t, err)
	require.Equal(t, rest, ids(evs2), "the resumed stream after the crash")
	require.True(t, p.running(), "the process exited with %d", p.Code())
	require.NotContains(t, p.logs.String(), "panic")
}

// placeOnce places the i-th order of client c for tenant acme (with the
// Idempotency-Key key unless it is "") and returns what it got, parsed.
func placeOnce(t *testing.T, base string, c, i int, key string) writeAnswer {
	t.Helper()
	a := writeAnswer{client: c, key: key, start: time.Now()}
	rctx, cancel := context.WithTimeout(context.Background(), 2*outageBound)
	defer cancel()
	body := map[string]any{"type": "orders:write:place",
		"payload": map[string]any{"customer": fmt.Sprintf("client-%d", c), "amountCents": 100 + i}}
	var headers []string
	if key != "" {
		headers = []string{"Idempotency-Key", key}
	}
	a.code, a.body, a.err = post(rctx, t, base+"/api/write", "acme", body, headers...)
	a.end = time.Now()
	if a.err != nil {
		return a
	}
	if a.code == http.StatusOK {
		var res struct {
			Data struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(a.body, &res); err != nil || res.Data.ID == "" {
			a.err = fmt.Errorf("200 without an order id: %s", a.body)
		}
		a.orderID = res.Data.ID
		return a
	}
	var env struct {
		Error *struct {
			Code       string `json:"code"`
			HTTPStatus int    `json:"httpStatus"`
			Message    string `json:"message"`
			RequestID  string `json:"requestId"`
		} `json:"error"`
	}
	switch err := json.Unmarshal(a.body, &env); {
	case err != nil:
		a.envelopeState = "not JSON: " + err.Error()
	case env.Error == nil:
		a.envelopeState = "no error object"
	case env.Error.HTTPStatus != a.code:
		a.envelopeState = fmt.Sprintf("httpStatus %d in a %d answer", env.Error.HTTPStatus, a.code)
	case env.Error.Message == "" || env.Error.RequestID == "":
		a.envelopeState = "no message or request id"
	default:
		a.errorCode, a.requestID = env.Error.Code, env.Error.RequestID
	}
	return a
}
