package sse_test

import (
	"bufio"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestHeartbeatDuringReplay: a resumed stream whose replay sends nothing
// for a while (its filter passes none of the backlog, or a page's read is
// slow) is idle to every proxy on its way, as a live stream without events
// is: it gets its heartbeats meanwhile, or a proxy's idle timeout cuts it
// and the client, resuming from the same id, replays the same backlog
// again, never reaching the live part. Here the replay is held in a page
// read (a lock) while the stream is watched for heartbeats.
func TestHeartbeatDuringReplay(t *testing.T) {
	t.Parallel()
	const beat = 100 * time.Millisecond
	b := setup(t, &sse.Config{Heartbeat: beat, ReplayBatch: 1})
	ctx := context.Background()
	log := b.memoBacklog(t, "acme", 501)

	// The stream wants orders only: the replay of 500 memos sends nothing.
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	resp, err := http.DefaultClient.Do(b.newRequest(t, rctx, request{tenant: "acme", query: "streamTypes=order", lastID: log[0]}))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := make(chan string, 1000)
	go func() {
		defer close(lines)
		br := bufio.NewReader(resp.Body)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			lines <- l
		}
	}()
	require.Equal(t, "retry: 2000\n", <-lines)

	// Hold the replay in its next page's read.
	release := b.holdReplayReads(t)
	defer release()
	eventually(t, "the replay waits for the lock", func() bool { return b.replayReadsWaiting(t) > 0 })
	beats := 0
	window := time.After(10 * beat)
watch:
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the stream ended")
			if l == ": heartbeat\n" {
				beats++
			}
		case <-window:
			break watch
		}
	}
	require.GreaterOrEqual(t, beats, 3, "a replay that sent nothing for %v sent %d heartbeats", 10*beat, beats)

	// Released, the replay ends and the stream goes live.
	release()
	b.place(t, "acme", "ACME")
	for l := range lines {
		if len(l) > 7 && l[:7] == "event: " {
			require.Equal(t, "event: orders:event:placed\n", l)
			return
		}
	}
	t.Fatal("the stream ended before the live order")
}
