package sse_test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestReplaysLeaveThePoolToWrites: the replays of a burst of resuming
// clients (an API instance died and its browsers resume on the survivors,
// each with its Last-Event-ID) share the pool with the writes. Each replay
// read holds a pool connection while it runs; unbounded, the burst takes
// every connection when the reads are slow, and the writes wait. Here the
// reads are held (a lock on event_prune_marks, which every resume check and
// replay page reads and no write touches), first in the resume checks of
// the burst, then in the pages of their replays: a write must still get a
// connection and commit at once, and once the lock is gone every client
// must get the tenant's log exactly, each event once, in order.
func TestReplaysLeaveThePoolToWrites(t *testing.T) {
	t.Parallel()
	const (
		conns   = 4
		clients = 6
		backlog = 1500
		// writeWithin bounds a write while the replays are held: it waits
		// for no replay (a free connection), only for its own round trips.
		writeWithin = 5 * time.Second
	)
	b := setupPool(t, &sse.Config{ReplayBatch: 5}, nil, conns)
	ctx := context.Background()
	log := b.memoBacklog(t, "acme", backlog)
	hold := func() (release func()) { return b.holdReplayReads(t) }
	waiting := func() int { return b.replayReadsWaiting(t) }
	// write appends one note and fails the test unless it commits within
	// writeWithin.
	n := 0
	write := func(what string) {
		t.Helper()
		n++
		wctx, cancel := context.WithTimeout(ctx, writeWithin)
		defer cancel()
		began := time.Now()
		_, err := b.rt.InTx(wctx, "acme", framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream, b.noted.With(Noted{N: backlog + n}))
		})
		require.NoError(t, err, "%s: a write found no connection within %s (after %s); the pool: %d of %d acquired",
			what, writeWithin, time.Since(began), b.pool.Stat().AcquiredConns(), conns)
	}

	// The burst arrives while the reads are held: its resume checks wait.
	release := hold()
	var mu sync.Mutex
	got := make([][]string, clients)
	errs := make([]error, clients)
	rctx, cancel := context.WithTimeout(ctx, 2*wait)
	defer cancel()
	var wg sync.WaitGroup
	for i := range clients {
		req := b.newRequest(t, rctx, request{tenant: "acme", lastID: log[0]})
		wg.Go(func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				errs[i] = errors.New(resp.Status)
				return
			}
			rd := sse.NewReader(resp.Body)
			if _, err := readOpen(rd); err != nil {
				errs[i] = err
				return
			}
			for {
				ev, err := rd.Next()
				if err != nil {
					errs[i] = err
					return
				}
				mu.Lock()
				got[i] = append(got[i], ev.ID)
				mu.Unlock()
			}
		})
	}
	eventually(t, "the burst's reads wait for the lock", func() bool { return waiting() > 0 })
	// Let the rest of the burst arrive (they wait for the lock, or for a
	// connection, or for their share of the pool).
	time.Sleep(300 * time.Millisecond)
	write("while the resume checks wait")
	release()

	// Then held again in their replays' pages.
	eventually(t, "every client replaying", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i := range got {
			if len(got[i]) == 0 {
				return false
			}
		}
		return true
	})
	release = hold()
	write("while the replay pages wait")
	release()
	write("after the replays")

	want := b.logOf(t, "acme")[1:]
	deadline := time.Now().Add(wait)
	for {
		mu.Lock()
		done := true
		for i := range got {
			require.NoError(t, errs[i], "client %d", i)
			if len(got[i]) < len(want) {
				done = false
			}
		}
		mu.Unlock()
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "the clients did not get the whole log in time")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	for i := range got {
		require.Equal(t, want, got[i], "client %d: each event once, in order", i)
	}
}

// TestCloseEndsTheWaitForAReplayTurn: streams waiting for their turn to
// read (Config.ReplayConns) are answered by Close at once, as the one whose
// read Close cancels: a burst waiting behind a slow read must not hold the
// drain up.
func TestCloseEndsTheWaitForAReplayTurn(t *testing.T) {
	t.Parallel()
	const clients = 3
	b := setup(t, &sse.Config{ReplayConns: 1})
	ctx := context.Background()
	b.note(t, "acme", "memo", 0, "")
	log := b.logOf(t, "acme")
	last, err := sse.ParseEventID(log[0])
	require.NoError(t, err)
	eventually(t, "hub past the note", func() bool { return !b.hub.Position().Less(last) })

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE event_prune_marks IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	codes := make(chan int, clients)
	for range clients {
		req := b.newRequest(t, ctx, request{tenant: "acme", lastID: log[0]})
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				codes <- 0
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	eventually(t, "one read waits for the lock", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx,
			`SELECT count(*) FROM pg_locks WHERE relation = 'event_prune_marks'::regclass AND NOT granted`).Scan(&n))
		return n > 0
	})
	time.Sleep(200 * time.Millisecond) // the others reach their wait for a turn
	began := time.Now()
	b.hub.Close()
	for range clients {
		select {
		case code := <-codes:
			require.Equal(t, http.StatusServiceUnavailable, code)
		case <-time.After(10 * time.Second):
			t.Fatal("a stream waiting for its turn to read outlasted Close")
		}
	}
	require.Less(t, time.Since(began), 5*time.Second)
}

// TestResumeWaitingForItsCheckIsBounded: a resuming request's status comes
// after its resume id's check (a bad or pruned id is a 400), so until the
// check is done the response has not started and can carry no heartbeat.
// A check that waits for its turn among Config.ReplayConns (here the only
// turn is held by another stream's replay, whose page read waits for a
// lock) must not leave the request silent for longer than
// Config.ResumeWait, or a proxy's idle timeout cuts it with an error the
// client cannot tell from a refused id: it is answered 503, retry.
func TestResumeWaitingForItsCheckIsBounded(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	b := setup(t, &sse.Config{ReplayConns: 1, ReplayBatch: 1, ResumeWait: bound})
	rctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	b.resumeHeldInReplay(t, rctx)
	log := b.logOf(t, "acme")

	ctx, stop := context.WithTimeout(context.Background(), 20*bound)
	defer stop()
	began := time.Now()
	resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "acme", lastID: log[0]}))
	require.NoError(t, err, "a resume waiting for its check's turn was silent for %s", time.Since(began))
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.GreaterOrEqual(t, time.Since(began), bound)
}

// TestResumeCheckGoesBeforeQueuedPages: a resuming request's id check
// waits for a turn among Config.ReplayConns as the replays' pages do, but
// it has no response yet (no heartbeat) and is bounded by
// Config.ResumeWait, while a stream waiting for a page has its response
// and its heartbeats. So the check takes the next turn, before the pages
// queued ahead of it: in a burst of reconnecting clients a new resume is
// answered instead of waiting for every queued page (and a 503). Here the
// only turn is held by a replay's page read (a lock), other replays queue
// their pages behind it, then a new resume's check; when the turn is
// free, the read that takes it is caught on a second lock (on events,
// which both kinds read first): it must be the check.
func TestResumeCheckGoesBeforeQueuedPages(t *testing.T) {
	t.Parallel()
	const streams = 3
	// The hub's pool of its own: the test's locks and looks at them use the
	// database's.
	b := setupPool(t, &sse.Config{ReplayConns: 1, ReplayBatch: 1, ResumeWait: wait}, nil, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	log := b.memoBacklog(t, "acme", 501)
	// Streams whose replays (orders only: nothing of the memos is sent)
	// read page after page.
	for range streams {
		resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "acme", query: "streamTypes=order", lastID: log[0]}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "retry: 2000\n", line)
	}
	release := b.holdReplayReads(t)
	defer release()
	eventually(t, "a page's read holds the turn, waiting for the lock", func() bool { return b.replayReadsWaiting(t) > 0 })
	time.Sleep(200 * time.Millisecond) // the other streams queue their pages

	answered := make(chan int, 1)
	go func() {
		resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "acme", lastID: log[0]}))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	time.Sleep(200 * time.Millisecond) // the new resume's check queues after them

	// The second lock, queued behind the read holding the turn: granted
	// when that read ends, it catches the next read in its first query.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	locked, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		_, err := tx.Exec(ctx, `LOCK TABLE events IN ACCESS EXCLUSIVE MODE`)
		locked <- err
	}()
	defer func() {
		release()
		cancel()
		<-done
	}()
	eventually(t, "the second lock queued", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx,
			`SELECT count(*) FROM pg_locks WHERE pid = $1 AND relation = 'events'::regclass AND NOT granted`, pid).Scan(&n))
		return n > 0
	})
	release()
	require.NoError(t, <-locked)

	// Which read waits for it: the check, or a page? (Not the
	// dispatcher's, which reads events through event_consumers.)
	var next string
	deadline := time.Now().Add(5 * time.Second)
	for next == "" && time.Now().Before(deadline) {
		err := b.db.Pool.QueryRow(ctx, `SELECT a.query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.relation = 'events'::regclass AND NOT l.granted AND a.query LIKE 'SELECT%' AND a.query NOT LIKE '%event_consumers%' LIMIT 1`).Scan(&next)
		if errors.Is(err, pgx.ErrNoRows) {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		require.NoError(t, err)
	}
	require.NotEmpty(t, next, "no read took the turn")
	require.True(t, strings.HasPrefix(next, "SELECT commit_key FROM events WHERE position"),
		"a queued page took the turn before the waiting resume's check: %s", next)

	require.NoError(t, tx.Rollback(ctx))
	select {
	case code := <-answered:
		require.Equal(t, http.StatusOK, code)
	case <-time.After(wait):
		t.Fatal("the new resume was not answered")
	}
}
