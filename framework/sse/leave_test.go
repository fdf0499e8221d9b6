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
	ctx := context.Background()
	log := b.memoBacklog(t, "acme", 501)

	// Orders only: the replay of 500 memos sends nothing, page by page.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := http.DefaultClient.Do(b.newRequest(t, rctx, request{tenant: "acme", query: "streamTypes=order", lastID: log[0]}))
	require.NoError(t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "retry: 2000\n", line)

	defer b.holdReplayReads(t)()
	eventually(t, "the replay waits for the lock", func() bool { return b.replayReadsWaiting(t) > 0 })
	require.Equal(t, 1, b.hub.Clients())
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for b.hub.Clients() > 0 {
		require.True(t, time.Now().Before(deadline), "the handler of a client that left mid-replay is still subscribed")
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCloseEndsAReplayWaitingForARead: Close ends a stream whose replay
// waits in a page's read (a lock held by a migration, say) at once, as it
// ends one blocked in a write: the HTTP server's shutdown waits for every
// handler, and the read may wait for longer than the drain.
func TestCloseEndsAReplayWaitingForARead(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{ReplayBatch: 1})
	ctx := context.Background()
	log := b.memoBacklog(t, "acme", 501)

	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	resp, err := http.DefaultClient.Do(b.newRequest(t, rctx, request{tenant: "acme", query: "streamTypes=order", lastID: log[0]}))
	require.NoError(t, err)
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "retry: 2000\n", line)

	defer b.holdReplayReads(t)()
	eventually(t, "the replay waits for the lock", func() bool { return b.replayReadsWaiting(t) > 0 })
	b.hub.Close()
	deadline := time.Now().Add(10 * time.Second)
	for b.hub.Clients() > 0 {
		require.True(t, time.Now().Before(deadline), "Close left a stream replaying while its read waits")
		time.Sleep(5 * time.Millisecond)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err, "the response ends normally")
}
