package sse_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestClientLeavingMidReplayEndsItsHandler: a client that goes away while
// its resumed stream replays (its handler waits in a page's read) ends the
// handler at once: the read is cancelled with the request, the heartbeat
// goroutine stops, and the client leaves the hub, before the read's lock
// is released (goleak checks the goroutines at the package's end).
func TestClientLeavingMidReplayEndsItsHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{ReplayBatch: 1, Heartbeat: 20 * time.Millisecond})
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := b.resumeHeldInReplay(t, rctx)
	require.Equal(t, 1, b.hub.Clients())
	cancel()
	resp.Body.Close()
	b.untilNoClients(t, "the handler of a client that left mid-replay is still subscribed")
}

// TestCloseEndsAReplayWaitingForARead: Close ends a stream whose replay
// waits in a page's read (a lock held by a migration, say) at once, as it
// ends one blocked in a write: the HTTP server's shutdown waits for every
// handler, and the read may wait for longer than the drain.
func TestCloseEndsAReplayWaitingForARead(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{ReplayBatch: 1})
	rctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	resp := b.resumeHeldInReplay(t, rctx)
	b.hub.Close()
	b.untilNoClients(t, "Close left a stream replaying while its read waits")
	_, err := io.Copy(io.Discard, resp.Body)
	require.NoError(t, err, "the response ends normally")
}

// resumeHeldInReplay resumes an orders-only stream of acme on ctx from the
// first of 501 memos (its replay sends nothing, page by page), and holds
// the replay in a page's read until the test ends, when the response is
// closed too.
func (b *bundle) resumeHeldInReplay(t *testing.T, ctx context.Context) *http.Response {
	t.Helper()
	log := b.memoBacklog(t, "acme", 501)
	resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "acme", query: "streamTypes=order", lastID: log[0]}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "retry: 2000\n", line)
	t.Cleanup(b.holdReplayReads(t))
	eventually(t, "the replay waits for the lock", func() bool { return b.replayReadsWaiting(t) > 0 })
	return resp
}

// untilNoClients waits (10 s at most) until the hub has no client.
func (b *bundle) untilNoClients(t *testing.T, msg string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.hub.Clients() > 0 {
		require.True(t, time.Now().Before(deadline), msg)
		time.Sleep(5 * time.Millisecond)
	}
}
