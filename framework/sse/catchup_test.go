package sse_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestResumeUnderSteadyLoadReachesLive: a client resumes far behind (a
// backlog of thousands of events) while a writer appends steadily, one
// event every 10 ms. Its replay takes longer than its small buffer can hold
// the live events that arrive meanwhile, although the client reads as fast
// as it can. It must not be dropped for that: it must reach the live part
// of the stream while the writer goes on, in one connection, with the
// tenant's log exactly (no gap, no duplicate at the join).
//
// A client that was dropped reconnects as a browser does, from its last id
// after the stream's retry delay: the attempts show whether resuming
// converges. Dropped, it falls behind by the writes of the delay each time
// and gains only what it replays before its buffer fills again, so it
// never gets there.
//
// Replay pages of 4 events keep the replay a few times faster than the
// writer, not a hundred: the client can catch up, but only by reading on
// past what its buffer held.
func TestResumeUnderSteadyLoadReachesLive(t *testing.T) {
	t.Parallel()
	const (
		// buffer holds 640 ms of the writer's events: far less than the
		// replay takes, and enough slack once live for a reader that a
		// loaded machine starves for a moment.
		buffer  = 64
		backlog = 2000
		pace    = 10 * time.Millisecond
		retry   = time.Second
		// reach is how long the client has to reach live; the replay of
		// the backlog takes a second or two.
		reach = 20 * time.Second
		// nearLive is how far behind the writer the client may be and
		// count as live (a few dispatcher passes).
		nearLive = 3 * buffer
	)
	b := setup(t, &sse.Config{Buffer: buffer, ReplayBatch: 4, Retry: retry, WriteTimeout: 5 * time.Second})
	_, err := b.rt.InTx(context.Background(), "acme", framework.Metadata{CorrelationID: "backlog"},
		func(_ context.Context, tx *framework.Tx) error {
			for i := range backlog {
				if err := tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream,
					b.noted.With(Noted{N: -1 - i, Text: "backlog"})); err != nil {
					return err
				}
			}
			return nil
		})
	require.NoError(t, err)
	log := b.logOf(t, "acme")
	first := log[0]
	// The backlog is behind the hub: the client gets it by replay, not as
	// a burst of live events.
	end, err := sse.ParseEventID(log[len(log)-1])
	require.NoError(t, err)
	eventually(t, "hub past the backlog", func() bool { return !b.hub.Position().Less(end) })

	// The steady writer: note N, one every pace, until stopped.
	var published atomic.Int64
	wctx, stopWriter := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() {
		tick := time.NewTicker(pace)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			_, err := b.rt.InTx(context.Background(), "acme", framework.Metadata{CorrelationID: fmt.Sprintf("live-%d", n)},
				func(_ context.Context, tx *framework.Tx) error {
					return tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream, b.noted.With(Noted{N: n, Text: "live"}))
				})
			if err != nil {
				writeErr = err
				return
			}
			published.Store(int64(n + 1))
		}
	})
	stop := func() {
		stopWriter()
		wg.Wait()
	}
	defer stop()

	var got []string
	var attempts []string
	lastID := first
	deadline := time.Now().Add(reach)
	for {
		require.True(t, time.Now().Before(deadline),
			"the resuming client never reached live within %s: %d attempts, each dropped:\n%s", reach, len(attempts), strings.Join(attempts, "\n"))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "acme", lastID: lastID}))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		rd := sse.NewReader(resp.Body)
		requireOpen(t, rd)
		began, before := time.Now(), len(got)
		live := false
		var ended error
		for !live {
			ev, err := rd.Next()
			if err != nil {
				ended = err
				break
			}
			got = append(got, ev.ID)
			lastID = ev.ID
			var d sse.Data
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			var p Noted
			require.NoError(t, json.Unmarshal(d.Payload, &p))
			live = p.Text == "live" && published.Load()-int64(p.N+1) <= nearLive
		}
		if !live {
			resp.Body.Close()
			cancel()
			attempts = append(attempts, fmt.Sprintf("  resume %d: %d events in %s, then the stream ended (%v), %d writes behind",
				len(attempts)+1, len(got)-before, time.Since(began).Round(time.Millisecond), ended, published.Load()+backlog-int64(len(got))-1))
			time.Sleep(retry) // the retry hint, as an EventSource waits it
			continue
		}
		// Live: the writer stops; the stream brings the rest of the log.
		stop()
		require.NoError(t, writeErr)
		want := b.logOf(t, "acme")
		for len(got) < len(want)-1 {
			ev, err := rd.Next()
			require.NoError(t, err, "the live stream ended after %d of %d events", len(got), len(want)-1)
			got = append(got, ev.ID)
		}
		resp.Body.Close()
		cancel()
		t.Logf("live after %s in %d connection(s), %d writes during it", time.Since(deadline.Add(-reach)).Round(time.Millisecond),
			len(attempts)+1, published.Load())
		require.Empty(t, attempts, "the resuming client was dropped")
		require.Equal(t, want[1:], got, "the log exactly: no gap, no duplicate")
		require.Zero(t, b.metric(t, "kumiko_sse_dropped_clients_total"))
		return
	}
}

// TestResumedClientSlowLiveIsDropped: the replay's leniency ends with the
// replay. A client that resumed, got its backlog and the live events after
// it, and then stops reading is dropped when its buffer overflows, like any
// slow live client (its write timeout, a minute, is far off).
func TestResumedClientSlowLiveIsDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{Buffer: 16, WriteTimeout: time.Minute})
	for i := range 3 {
		b.note(t, "acme", "memo", i, "backlog")
	}
	log := b.logOf(t, "acme")
	end, err := sse.ParseEventID(log[len(log)-1])
	require.NoError(t, err)
	eventually(t, "hub past the backlog", func() bool { return !b.hub.Position().Less(end) })

	conn := b.dialResume(t, b.token(t, "acme"), log[0])
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	rd := sse.NewReader(resp.Body)
	requireOpen(t, rd)
	var got []string
	for range 2 {
		ev, err := rd.Next()
		require.NoError(t, err)
		got = append(got, ev.ID)
	}
	require.Equal(t, log[1:], got, "the replay")
	b.note(t, "acme", "memo", 3, "live")
	ev, err := rd.Next()
	require.NoError(t, err)
	require.Equal(t, b.logOf(t, "acme")[3], ev.ID, "the live event")

	// Live now; the client stops reading.
	start := time.Now()
	big := strings.Repeat("x", 100_000)
	for i := 0; b.hub.Clients() == 1; i++ {
		require.Less(t, i, 400, "the resumed client that stopped reading live was never dropped")
		b.note(t, "acme", "memo", 4+i, big)
	}
	require.Less(t, time.Since(start), time.Minute, "dropped by its full buffer, not by the write timeout")
	require.InDelta(t, 1, b.metric(t, "kumiko_sse_dropped_clients_total"), 0)
}
