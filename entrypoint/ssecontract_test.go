package entrypoint_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/framework/web"
)

// TestSSEFrameContract reads the stream of a real process byte by byte:
// the retry hint, then a frame of exactly id, event and data lines, whose
// data carries the fields the README names, equal to the event's row.
func TestSSEFrameContract(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	p := start(t, "frame", procEnv("all-in-one", db.URL, rds.URL, "frame-1"))
	p.waitReady(t)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+sse.Path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token(t, "acme"))
	resp, err := httpClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	require.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	br := bufio.NewReader(resp.Body)
	line := func() string {
		s, err := br.ReadString('\n')
		require.NoError(t, err)
		return s
	}
	require.Equal(t, "retry: 2000\n", line())
	require.Equal(t, "\n", line())
	// The opening frame: no id, the consistency token the client loads
	// its state with (also in the response header).
	require.Equal(t, "event: "+sse.OpenEvent+"\n", line())
	require.Equal(t, `data: {"consistencyToken":"`+resp.Header.Get(web.HeaderConsistencyToken)+`"}`+"\n", line())
	require.True(t, framework.ValidConsistencyToken(resp.Header.Get(web.HeaderConsistencyToken)))
	require.Equal(t, "\n", line())

	code, body, err := post(ctx, t, p.url+"/api/write", "acme",
		map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada \u2028\n\"x\"", "amountCents": 4200}},
		"X-Correlation-ID", "corr-frame-1")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, string(body))

	idLine, evLine, dataLine, end := line(), line(), line(), line()
	require.Equal(t, "\n", end, "a frame is id, event and one data line")
	id, ok := strings.CutPrefix(idLine, "id: ")
	require.True(t, ok, idLine)
	id = strings.TrimSuffix(id, "\n")
	require.Equal(t, "event: orders:event:placed\n", evLine)
	data, ok := strings.CutPrefix(dataLine, "data: ")
	require.True(t, ok, dataLine)

	var row struct {
		id, tenant, streamType, streamID, user, corr, caus string
		position, version                                  int64
		payload                                            []byte
		created                                            time.Time
	}
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT commit_key::text || '-' || position, position, stream_type, stream_id, version,
		payload, created_at, coalesce(metadata->>'userId',''), coalesce(metadata->>'correlationId',''), coalesce(metadata->>'causationId','')
		FROM events WHERE tenant_id = 'acme'`).Scan(&row.id, &row.position, &row.streamType, &row.streamID, &row.version,
		&row.payload, &row.created, &row.user, &row.corr, &row.caus))
	require.Equal(t, row.id, id)

	var d map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(data), &d))
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	require.ElementsMatch(t, []string{"id", "position", "type", "stream", "version", "payload", "correlationId", "causationId", "userId", "createdAt"}, keys, data)
	var got sse.Data
	require.NoError(t, json.Unmarshal([]byte(data), &got))
	require.Equal(t, id, got.ID)
	require.Equal(t, row.position, got.Position)
	require.Equal(t, "orders:event:placed", got.Type)
	require.Equal(t, sse.Stream{Type: row.streamType, ID: row.streamID}, got.Stream)
	require.Equal(t, row.version, got.Version)
	require.JSONEq(t, string(row.payload), string(got.Payload))
	require.Equal(t, "corr-frame-1", got.CorrelationID)
	require.Equal(t, row.corr, got.CorrelationID)
	require.NotEmpty(t, got.CausationID)
	require.Equal(t, row.caus, got.CausationID)
	require.Equal(t, "u-acme", got.UserID)
	require.Equal(t, row.user, got.UserID)
	require.True(t, row.created.Equal(got.CreatedAt), "createdAt %s, row %s", got.CreatedAt, row.created)
}

// writeBurst runs writers goroutines that each place perWriter orders of
// tenant through base and cancel every other one, and returns a wait that
// fails the test on a write error.
func writeBurst(t *testing.T, base func() string, tenant string, writers, perWriter int) (wait func()) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				id, err := placeVia(t, base(), tenant, fmt.Sprintf("w%d-%d", w, i))
				if err == nil && i%2 == 0 {
					err = cancelVia(t, base(), tenant, id)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	return func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
}

// placeVia places an order through base and returns its id.
func placeVia(t *testing.T, base, tenant, customer string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	code, body, err := post(ctx, t, base+"/api/write", tenant,
		map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": customer, "amountCents": 1}})
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("place answered %d: %s", code, body)
	}
	if err != nil {
		return "", err
	}
	var res struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	return res.Data.ID, json.Unmarshal(body, &res)
}

// cancelVia cancels order id (at version 1) through base.
func cancelVia(t *testing.T, base, tenant, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	code, body, err := post(ctx, t, base+"/api/write", tenant,
		map[string]any{"type": "orders:write:cancel", "payload": map[string]any{"orderId": id, "expectedVersion": 1}})
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("cancel answered %d: %s", code, body)
	}
	return err
}

// tenantLogOf returns the cursors of tenant's events of type typ ("": any)
// in delivery order.
func tenantLogOf(t *testing.T, db *kumikotest.DB, tenant, typ string) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(),
		`SELECT commit_key::text || '-' || position FROM events WHERE tenant_id = $1 AND ($2 = '' OR type = $2) ORDER BY commit_key, position`, tenant, typ)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestSSEDrainResumesOnAnotherProcess: two API processes; four goroutines
// place and cancel orders through the second while clients of the first
// (unfiltered, and filtered to one type) read. SIGTERM drains the first in
// the middle of the burst: each stream ends cleanly and resumes on the
// second with its last id. A client that resumes with a filter excluding
// the event its id names (it switched filters) gets the events of its
// filter after that id. Each ends up with the log, filtered, exactly.
func TestSSEDrainResumesOnAnotherProcess(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	api1 := start(t, "drain-1", procEnv("api", db.URL, rds.URL, "drain-sse-1"))
	api2 := start(t, "drain-2", procEnv("api", db.URL, rds.URL, "drain-sse-2"))
	api1.waitReady(t)
	api2.waitReady(t)

	const placed, cancelled = "types=orders:event:placed", "types=orders:event:cancelled"
	all, err := openStream(t, api1.url, "acme", "", "")
	require.NoError(t, err)
	onlyPlaced, err := openStream(t, api1.url, "acme", placed, "")
	require.NoError(t, err)
	onlyCancelled, err := openStream(t, api1.url, "acme", cancelled, "")
	require.NoError(t, err)

	done := writeBurst(t, func() string { return api2.url }, "acme", 4, 20)
	all.waitFor(t, 10)
	require.NoError(t, api1.cmd.Process.Signal(syscall.SIGTERM))
	for _, s := range []*stream{all, onlyPlaced, onlyCancelled} {
		require.ErrorIs(t, s.ended(t, 10*time.Second), io.EOF, "the stream ends cleanly")
	}
	require.Equal(t, 0, api1.waitExit(t, wait))

	type resumed struct {
		before []string
		s      *stream
		typ    string
	}
	var rs []resumed
	for _, c := range []struct {
		s     *stream
		query string
		typ   string
	}{{all, "", ""}, {onlyPlaced, placed, "orders:event:placed"}, {onlyCancelled, cancelled, "orders:event:cancelled"}} {
		got, _ := c.s.snapshot()
		require.NotEmpty(t, got)
		r, err := openStream(t, api2.url, "acme", c.query, got[len(got)-1].ID)
		require.NoError(t, err)
		rs = append(rs, resumed{before: ids(got), s: r, typ: c.typ})
	}
	// The switcher: its last id is a placed event (one in the middle of
	// what the placed client got); it resumes for cancelled events only.
	pl, _ := onlyPlaced.snapshot()
	switchFrom := pl[len(pl)/2].ID
	switcher, err := openStream(t, api2.url, "acme", cancelled, switchFrom)
	require.NoError(t, err)

	done()
	for _, r := range rs {
		want := tenantLogOf(t, db, "acme", r.typ)
		got := append(r.before, ids(r.s.waitFor(t, len(want)-len(r.before)))...)
		require.Equal(t, want, got, "type %q", r.typ)
	}
	wantSwitch := []string{}
	for _, id := range tenantLogOf(t, db, "acme", "orders:event:cancelled") {
		if cursorLess(t, switchFrom, id) {
			wantSwitch = append(wantSwitch, id)
		}
	}
	require.Equal(t, wantSwitch, ids(switcher.waitFor(t, len(wantSwitch))))
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	for _, r := range rs {
		evs, _ := r.s.snapshot()
		require.Len(t, evs, len(tenantLogOf(t, db, "acme", r.typ))-len(r.before), "no duplicate, type %q", r.typ)
	}
	evs, _ := switcher.snapshot()
	require.Len(t, evs, len(wantSwitch))
}

// cursorLess compares two frame ids as cursors.
func cursorLess(t *testing.T, a, b string) bool {
	t.Helper()
	ca, err := sse.ParseEventID(a)
	require.NoError(t, err)
	cb, err := sse.ParseEventID(b)
	require.NoError(t, err)
	return ca.Less(cb)
}

// TestSSETenantIsolationUnderLoad: clients of three tenants on two API
// processes while writers of all three write concurrently: each client
// gets its own tenant's log exactly, and nothing of another's.
func TestSSETenantIsolationUnderLoad(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	api1 := start(t, "iso-1", procEnv("api", db.URL, rds.URL, "iso-1"))
	api2 := start(t, "iso-2", procEnv("api", db.URL, rds.URL, "iso-2"))
	api1.waitReady(t)
	api2.waitReady(t)
	tenants := []string{"t-a", "t-b", "t-c"}
	clients := map[string][]*stream{}
	for _, tn := range tenants {
		for _, p := range []*proc{api1, api2} {
			s, err := openStream(t, p.url, tn, "", "")
			require.NoError(t, err)
			clients[tn] = append(clients[tn], s)
		}
	}
	var waits []func()
	for i, tn := range tenants {
		via := api1
		if i%2 == 1 {
			via = api2
		}
		waits = append(waits, writeBurst(t, func() string { return via.url }, tn, 2, 10))
	}
	for _, w := range waits {
		w()
	}
	for _, tn := range tenants {
		want := tenantLogOf(t, db, tn, "")
		require.Len(t, want, 30)
		for _, s := range clients[tn] {
			require.Equal(t, want, ids(s.waitFor(t, len(want))), tn)
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, tn := range tenants {
		for _, s := range clients[tn] {
			evs, _ := s.snapshot()
			require.Len(t, evs, 30, tn)
		}
	}
}

// TestSSEChurnLeaksNothing: many streams opened and left in every way (after
// a live frame, in the middle of a replay, before reading the answer, with
// a bad id, without a token) leave kumiko_sse_clients at 0 and no goroutine
// behind.
func TestSSEChurnLeaksNothing(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	p := start(t, "churn", procEnv("all-in-one", db.URL, rds.URL, "churn-1"))
	p.waitReady(t)

	first, err := openStream(t, p.url, "acme", "", "")
	require.NoError(t, err)
	for i := range 40 {
		p.place(t, "acme", fmt.Sprintf("c%d-%s", i, strings.Repeat("x", 150)))
	}
	firstID := first.waitFor(t, 40)[0].ID
	first.close()
	eventuallyMetric(t, p.url, "kumiko_sse_clients", 0)
	base := metricOf(t, p.url, "go_goroutines")

	for i := range 30 {
		s, err := openStream(t, p.url, "acme", "", "")
		require.NoError(t, err)
		go p.place(t, "acme", fmt.Sprintf("churn-%d", i))
		s.waitFor(t, 1)
		s.close()

		r, err := openStream(t, p.url, "acme", "", firstID)
		require.NoError(t, err)
		r.waitFor(t, 1)
		r.close()

		conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
		require.NoError(t, err)
		_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n%s: %s\r\n\r\n",
			sse.Path, token(t, "acme"), sse.HeaderLastEventID, firstID)
		require.NoError(t, err)
		require.NoError(t, conn.Close())

		_, err = openStream(t, p.url, "acme", "", "1-1")
		require.Error(t, err)
		_, err = openStream(t, p.url, "acme", "types=nope:event:x", "")
		require.Error(t, err)
	}
	eventuallyMetric(t, p.url, "kumiko_sse_clients", 0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := metricOf(t, p.url, "go_goroutines")
		if n <= base+3 {
			break
		}
		require.True(t, time.Now().Before(deadline), "goroutines %v, %v before the churn", n, base)
		time.Sleep(100 * time.Millisecond)
	}
}

// metricOf reads an unlabelled metric of base's /metrics.
func metricOf(t *testing.T, base, name string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	code, body, err := get(ctx, base+"/metrics")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	for l := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, l)
			return f
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// eventuallyMetric waits until base's metric name has value v.
func eventuallyMetric(t *testing.T, base, name string, v float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := metricOf(t, base, name)
		if got == v {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s is %v, want %v", name, got, v)
		time.Sleep(50 * time.Millisecond)
	}
}
