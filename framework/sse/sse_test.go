package sse_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/sse"
)

func TestAuthRequired(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	code, body := b.status(t, request{})
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, body, `"code":"unauthorized"`)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req := b.newRequest(t, ctx, request{})
	req.Header.Set("Authorization", "Bearer not-a-token")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// TestFrames checks the frame layout: retry hint, id, event and the data
// JSON with stream, version, payload, correlation id and created at.
func TestFrames(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 7, "hello")
	ev := c.waitFor(t, 1)[0]
	require.Equal(t, "sse-test:event:noted", ev.Type)
	_, err := sse.ParseEventID(ev.ID)
	require.NoError(t, err)
	var d sse.Data
	require.NoError(t, json.Unmarshal(ev.Data, &d))
	require.Equal(t, ev.ID, d.ID)
	require.Equal(t, "sse-test:event:noted", d.Type)
	require.Equal(t, "memo", d.Stream.Type)
	require.NotEmpty(t, d.Stream.ID)
	require.Equal(t, int64(1), d.Version)
	require.JSONEq(t, `{"n":7,"text":"hello"}`, string(d.Payload))
	require.Equal(t, "corr-7", d.CorrelationID)
	require.WithinDuration(t, time.Now(), d.CreatedAt, time.Minute)
	require.Equal(t, b.logOf(t, "acme"), []string{ev.ID})
}

func TestHeartbeatAndRetryHint(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{Heartbeat: 50 * time.Millisecond, Retry: 1500 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "acme"}))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "retry: 1500\n", line)
	beats := 0
	for beats < 3 {
		line, err = br.ReadString('\n')
		require.NoError(t, err)
		if line == ": heartbeat\n" {
			beats++
		}
	}
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	a := b.connect(t, request{tenant: "tenant-a"})
	z := b.connect(t, request{tenant: "tenant-b"})
	for i := range 6 {
		tenant := "tenant-a"
		if i%2 == 1 {
			tenant = "tenant-b"
		}
		b.note(t, tenant, "memo", i, tenant)
		b.place(t, tenant, "cust-"+tenant)
	}
	// Each sees exactly its own tenant's log: 3 notes and 3 orders.
	evA := a.waitFor(t, 6)
	evB := z.waitFor(t, 6)
	require.Equal(t, b.logOf(t, "tenant-a"), ids(evA))
	require.Equal(t, b.logOf(t, "tenant-b"), ids(evB))
	for _, ev := range evA {
		require.NotContains(t, string(ev.Data), "tenant-b")
	}
	for _, ev := range evB {
		require.NotContains(t, string(ev.Data), "tenant-a")
	}
	// And a resume with the other tenant's id is refused, not replayed.
	code, body := b.status(t, request{tenant: "tenant-b", lastID: evA[0].ID})
	require.Equal(t, http.StatusBadRequest, code, body)
	time.Sleep(100 * time.Millisecond) // nothing more may arrive
	require.Len(t, a.snapshot(), 6)
	require.Len(t, z.snapshot(), 6)
}

func TestFilters(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	all := b.connect(t, request{tenant: "acme"})
	notes := b.connect(t, request{tenant: "acme", query: "types=sse-test:event:noted"})
	orders := b.connect(t, request{tenant: "acme", query: "types=orders:event:placed,orders:event:cancelled"})
	memos := b.connect(t, request{tenant: "acme", query: "streamTypes=memo"})
	both := b.connect(t, request{tenant: "acme", query: "types=sse-test:event:noted&streamTypes=card&streamTypes=order"})

	b.note(t, "acme", "memo", 1, "")
	b.place(t, "acme", "c1")
	b.note(t, "acme", "card", 2, "")
	b.note(t, "acme", "memo", 3, "")
	last := all.waitFor(t, 4)

	typesOf := func(evs []sse.Event) []string {
		var out []string
		for _, e := range evs {
			var d sse.Data
			require.NoError(t, json.Unmarshal(e.Data, &d))
			out = append(out, d.Stream.Type)
		}
		return out
	}
	require.Equal(t, []string{"memo", "order", "card", "memo"}, typesOf(last))
	require.Equal(t, []string{"memo", "card", "memo"}, typesOf(notes.waitFor(t, 3)))
	require.Equal(t, []string{"order"}, typesOf(orders.waitFor(t, 1)))
	require.Equal(t, []string{"memo", "memo"}, typesOf(memos.waitFor(t, 2)))
	require.Equal(t, []string{"card"}, typesOf(both.waitFor(t, 1)))

	// A filtered resume replays only what passes the filter.
	replay := b.connect(t, request{tenant: "acme", query: "streamTypes=memo", lastID: last[0].ID})
	require.Equal(t, []string{"memo"}, typesOf(replay.waitFor(t, 1)))
	require.Equal(t, last[3].ID, replay.snapshot()[0].ID)

	for _, q := range []string{"types=orders:event:nope", "types=" + strings.Repeat("a,", 60), "streamTypes=%01x"} {
		code, body := b.status(t, request{tenant: "acme", query: q})
		require.Equal(t, http.StatusBadRequest, code, q)
		require.Contains(t, body, `"code":"validation_error"`, q)
	}
	// A filter that does not decode is refused, not dropped (which
	// would stream every type).
	for _, q := range []string{"types=%zz", "streamTypes=memo;x", "lastEventId=%"} {
		code, body := b.status(t, request{tenant: "acme", query: q})
		require.Equal(t, http.StatusBadRequest, code, q)
		require.Contains(t, body, `"code":"bad_request"`, q)
	}
	time.Sleep(100 * time.Millisecond)
	require.Len(t, orders.snapshot(), 1)
	require.Len(t, both.snapshot(), 1)
}

func TestBadCursor(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "")
	b.note(t, "other", "memo", 2, "")
	ev := c.waitFor(t, 1)[0]
	cur, err := sse.ParseEventID(ev.ID)
	require.NoError(t, err)
	other := b.logOf(t, "other")[0]

	bad := map[string]string{
		"malformed":          "abc",
		"negative":           "5--1",
		"leading zero":       "0" + ev.ID,
		"no such position":   fmt.Sprintf("%d-%d", cur.CommitKey, cur.Position+1_000_000),
		"wrong commit key":   eventstore.Cursor{CommitKey: cur.CommitKey + 1, Position: cur.Position}.String(),
		"other tenant's":     other,
		"position zero":      "0-0",
		"overlong":           strings.Repeat("1", 60) + "-1",
		"commit key too big": "99999999999999999999999-1",
	}
	for name, id := range bad {
		code, body := b.status(t, request{tenant: "acme", lastID: id})
		require.Equal(t, http.StatusBadRequest, code, name)
		require.Contains(t, body, `"code":"bad_request"`, name)
		code, _ = b.status(t, request{tenant: "acme", queryID: id})
		require.Equal(t, http.StatusBadRequest, code, name+" (query)")
	}
	// The header wins over the query parameter.
	ok := b.connect(t, request{tenant: "acme", lastID: ev.ID, queryID: "abc"})
	b.note(t, "acme", "memo", 3, "")
	require.Equal(t, b.logOf(t, "acme")[1:], ids(ok.waitFor(t, 1)))
}

// TestResume disconnects, writes meanwhile, and resumes with the last id:
// the second connection replays what was missed, then continues live.
func TestResume(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	first := b.connect(t, request{tenant: "acme"})
	for i := range 5 {
		b.note(t, "acme", "memo", i, "")
	}
	got := first.waitFor(t, 5)
	first.close()
	for i := 5; i < 10; i++ {
		b.note(t, "acme", "memo", i, "")
	}
	second := b.connect(t, request{tenant: "acme", queryID: got[4].ID})
	got = append(got, second.waitFor(t, 5)...)
	for i := 10; i < 15; i++ {
		b.note(t, "acme", "memo", i, "")
	}
	got = append(got[:10], second.waitFor(t, 10)[5:]...)
	require.Equal(t, b.logOf(t, "acme"), ids(got))
	time.Sleep(100 * time.Millisecond)
	require.Len(t, second.snapshot(), 10, "no duplicate after the handoff")
}

// TestResumeUnderLoad reconnects over and over while writers append
// concurrently; the union of what the connections received is the tenant's
// log exactly: nothing missed, nothing twice, in order.
func TestResumeUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const writers, perWriter = 4, 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			<-start
			for i := range perWriter {
				b.note(t, "acme", "memo", w*1000+i, "")
				if w == 0 {
					b.note(t, "noise", "memo", i, "") // another tenant's events interleave
				}
			}
		})
	}
	var got []sse.Event
	last := ""
	c := b.connect(t, request{tenant: "acme"})
	close(start)
	for len(got) < writers*perWriter {
		// Read a few events, then drop the connection and resume.
		c.waitFor(t, 1)
		time.Sleep(time.Duration(len(got)%7) * time.Millisecond)
		evs := c.snapshot()
		c.close()
		got = append(got, evs...)
		if len(got) > 0 {
			last = got[len(got)-1].ID
		}
		if len(got) >= writers*perWriter {
			break
		}
		c = b.connect(t, request{tenant: "acme", lastID: last})
	}
	wg.Wait()
	require.Equal(t, b.logOf(t, "acme"), ids(got))
}

// TestSlowClientDropped: a client that stops reading is cut off when its
// buffer overflows; a fast client on the same hub gets everything, and is
// not held up: if publishing waited for the slow client, the fast one would
// stall for the slow one's write timeout (a minute here: far longer than the
// writes take even on a loaded machine, so a drop before it can only be the
// full buffer's).
//
// The events are written in rounds of half the buffer, each waited for by
// the fast client, so the fast client's queue never holds more than that:
// one dispatcher pass publishes every event visible by then (up to 500), so
// unpaced writes that pile up behind the cluster-wide visibility horizon, or
// a reader starved of CPU, would overflow the fast client's buffer too. The
// slow client never reads, so its queue keeps growing until it overflows.
func TestSlowClientDropped(t *testing.T) {
	t.Parallel()
	const (
		writeTimeout = time.Minute
		buffer       = 64
		round        = buffer / 2
	)
	b := setup(t, &sse.Config{Buffer: buffer, WriteTimeout: writeTimeout})
	fast := b.connect(t, request{tenant: "acme"})

	// The slow client: a raw connection with a tiny receive buffer that
	// never reads after sending its request.
	conn, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer %s\r\n\r\n", sse.Path, b.token(t, "acme"))
	require.NoError(t, err)
	eventually(t, "both clients connected", func() bool { return b.hub.Clients() == 2 })

	// The slow client holds at most the socket buffers (up to 4 MB), the
	// frames its handler took last (up to a round, 3.2 MB) and its queue
	// (6.4 MB): 20 MB in all overflow it with a wide margin.
	const n = 200
	big := strings.Repeat("x", 100_000)
	start := time.Now()
	var dropped, fastLag time.Duration
	droppedAt := -1
	var got []sse.Event
	for i := 0; i < n; {
		for end := min(i+round, n); i < end; i++ {
			b.note(t, "acme", "memo", i, big)
			if dropped == 0 && b.hub.Clients() == 1 {
				dropped, droppedAt = time.Since(start), i
			}
		}
		written := time.Now()
		got = fast.waitFor(t, i)
		fastLag = max(fastLag, time.Since(written))
		if dropped == 0 && b.hub.Clients() == 1 {
			dropped, droppedAt = time.Since(start), i
		}
	}
	writeTime := time.Since(start)
	require.Equal(t, b.logOf(t, "acme"), ids(got))
	eventually(t, "slow client dropped", func() bool { return b.hub.Clients() == 1 })
	if dropped == 0 {
		dropped = time.Since(start)
	}
	t.Logf("writes took %s, slow client dropped after %s (event %d of %d), fast client complete at most %s after a round's last write", writeTime, dropped, droppedAt, n, fastLag)
	require.Less(t, dropped, writeTimeout, "dropped by its full buffer, not by the write timeout")
	require.Less(t, fastLag, writeTimeout/2, "the fast client was held up")
	require.InDelta(t, 1, b.metric(t, "kumiko_sse_dropped_clients_total"), 0)
	require.InDelta(t, 1, b.metric(t, "kumiko_sse_clients"), 0)

	// The server closed the slow connection: anything the client sends now
	// is answered with a reset (a closed socket cannot read it), so reading
	// fails at once instead of waiting for more events.
	_, _ = conn.Write([]byte("GET / HTTP/1.1\r\nHost: test\r\n\r\n"))
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
	_, err = io.Copy(io.Discard, conn)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the slow connection was not closed")
}

// TestCloseEndsStreamsCleanly: Close ends every open stream with a proper
// end of the chunked body (io.EOF, not an unexpected EOF) and refuses new
// ones with 503.
func TestCloseEndsStreamsCleanly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "")
	c.waitFor(t, 1)
	b.hub.Close()
	<-c.done
	require.ErrorIs(t, c.err, io.EOF)
	require.NotErrorIs(t, c.err, io.ErrUnexpectedEOF)
	code, body := b.status(t, request{tenant: "acme"})
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, `"code":"unavailable"`)
	require.Zero(t, b.hub.Clients())
}

// TestPrimeStartsAtHorizon: events committed before Prime are not pushed
// live, every later one is, and the state row sits at the hub's position.
func TestPrimeStartsAtHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	pos := b.hub.Position()
	var key uint64
	var p int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT cursor_commit_key::text::bigint, cursor_position FROM event_consumers WHERE name = $1`, sse.ConsumerName).Scan(&key, &p))
	require.Positive(t, key)
	require.True(t, !pos.Less(eventstore.Cursor{CommitKey: key, Position: p}))
	c := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "")
	require.Equal(t, b.logOf(t, "acme"), ids(c.waitFor(t, 1)))
	// A redelivery (a pass whose commit failed) is ignored by the hub.
	require.True(t, pos.Less(b.hub.Position()))
}

// TestCloseDuringReplay: Close ends streams that are still replaying a
// large backlog at once, as it ends live ones, so the process's drain is not
// held up. Two clients resume from the first of 200 events of 40 KB, read
// five at a time: one reads slowly (about 400 KB/s, so its replay would take
// some 20 s) and must stop getting pages; the other never reads, so its
// handler sits in a blocked write, which must be cut rather than waited for
// until the write timeout (a minute here). Neither counts as dropped, and
// what the slow one got is a prefix of the log, short of the backlog.
func TestCloseDuringReplay(t *testing.T) {
	t.Parallel()
	const (
		n      = 200
		prompt = 10 * time.Second // Close's effect, with room for a loaded machine
	)
	b := setup(t, &sse.Config{ReplayBatch: 5, WriteTimeout: time.Minute})
	big := strings.Repeat("x", 40<<10)
	for i := range n {
		b.note(t, "acme", "memo", i, big)
	}
	log := b.logOf(t, "acme")
	require.Len(t, log, n)
	last, err := sse.ParseEventID(log[n-1])
	require.NoError(t, err)
	// Subscribed from here on, both clients get the whole backlog by replay.
	eventually(t, "hub past the backlog", func() bool { return !b.hub.Position().Less(last) })
	dial := func() net.Conn { return b.dialResume(t, b.token(t, "acme"), log[0]) }

	// The stuck client: its handler fills the socket buffers (8 MB of
	// backlog is more than they hold) and blocks in a write.
	stuck := dial()
	eventually(t, "stuck client connected", func() bool { return b.hub.Clients() == 1 })
	sent := -1.0
	eventually(t, "stuck client's write blocked", func() bool {
		prev := sent
		sent = b.metric(t, "kumiko_sse_events_sent_total")
		if sent == prev && sse.Writing(b.hub) == 1 {
			return true
		}
		time.Sleep(300 * time.Millisecond)
		return false
	})
	require.Less(t, sent, float64(n-1), "the stuck client got the whole backlog")

	// The slow client: 4 KB per read, one read per 10 ms, until Close took
	// effect; then as fast as it can, to its end.
	slowConn := dial()
	var fast atomic.Bool
	rd := bufio.NewReader(readerFunc(func(p []byte) (int, error) {
		if !fast.Load() {
			time.Sleep(10 * time.Millisecond)
			p = p[:min(len(p), 4096)]
		}
		return slowConn.Read(p)
	}))
	var (
		mu     sync.Mutex
		got    []string
		endErr error
	)
	slowDone := make(chan struct{})
	go func() {
		defer close(slowDone)
		resp, err := http.ReadResponse(rd, nil)
		if err == nil {
			defer resp.Body.Close()
			r := sse.NewReader(resp.Body)
			if _, err = readOpen(r); err == nil {
				for {
					var ev sse.Event
					if ev, err = r.Next(); err != nil {
						break
					}
					mu.Lock()
					got = append(got, ev.ID)
					mu.Unlock()
				}
			}
		}
		mu.Lock()
		endErr = err
		mu.Unlock()
	}()
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got)
	}
	eventually(t, "slow client replaying", func() bool { return received() >= 5 })

	b.hub.Close()
	closed := time.Now()
	for b.hub.Clients() > 0 {
		require.Less(t, time.Since(closed), prompt, "%d streams still open after Close; the slow client got %d events",
			b.hub.Clients(), received())
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("streams ended %s after Close; the slow client had %d of %d events", time.Since(closed), received(), n-1)
	fast.Store(true)
	select {
	case <-slowDone:
	case <-time.After(wait):
		t.Fatal("the slow client's response did not end")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("the slow client got %d events in all, then %v", len(got), endErr)
	// io.EOF: ended between frames; io.ErrUnexpectedEOF: its write was cut.
	require.True(t, errors.Is(endErr, io.EOF) || errors.Is(endErr, io.ErrUnexpectedEOF), "slow client ended with %v", endErr)
	require.Less(t, len(got), n-1, "the slow client got the whole backlog")
	require.Equal(t, log[1:1+len(got)], got, "the slow client got a prefix of the replay")
	require.Zero(t, b.metric(t, "kumiko_sse_dropped_clients_total"), "Close is not a drop")

	// The stuck connection was closed by the server, not left open.
	require.NoError(t, stuck.SetReadDeadline(time.Now().Add(wait)))
	_, err = io.Copy(io.Discard, stuck)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the stuck connection was not closed")
}

// readerFunc adapts a function to io.Reader.
type readerFunc func(p []byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestStateRowRemovedUnderRunningHub: another process's stale sweep
// removes this instance's sse-broadcast row while the process runs (its
// heartbeats did not reach the database for 10 minutes). The dispatcher
// re-creates the row where the hub stands, so an open stream goes on
// getting every event, without a gap or a duplicate, instead of only
// heartbeats until a restart.
func TestStateRowRemovedUnderRunningHub(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "")
	c.waitFor(t, 1)
	ctx := context.Background()
	var created time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `DELETE FROM event_consumers WHERE name = $1 RETURNING created_at`, sse.ConsumerName).Scan(&created))
	for i := 2; i <= 4; i++ {
		b.note(t, "acme", "memo", i, "")
	}
	require.Equal(t, b.logOf(t, "acme"), ids(c.waitFor(t, 4)))
	var recreated time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT created_at FROM event_consumers WHERE name = $1`, sse.ConsumerName).Scan(&recreated))
	require.True(t, recreated.After(created), "the row was re-created")
	time.Sleep(100 * time.Millisecond)
	require.Len(t, c.snapshot(), 4, "no duplicate")
}
