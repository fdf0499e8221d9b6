package sse_test

import (
	"bufio"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestHubHammeredWhileClosing drives the hub's documented concurrent
// operations at once: clients connecting and leaving (subscribe and
// unsubscribe), events published faster than small buffers take them
// (drops), and Close in the middle of it. Nothing may panic, race or hang,
// and once every handler has returned no client is left.
func TestHubHammeredWhileClosing(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{Buffer: 4, WriteTimeout: 200 * time.Millisecond})
	tok := b.token(t, "t-race")
	apply := b.hub.Consumer().Apply
	var pos atomic.Int64
	pos.Store(1 << 40)
	publish := func() {
		p := pos.Add(1)
		_ = apply(context.Background(), nil, framework.Envelope{
			Position: p, CommitKey: 1 << 62, TenantID: "t-race", StreamType: "k", StreamID: "s",
			Version: 1, Type: b.noted.Name(), TypeVersion: 1, Payload: []byte(`{"n":1,"text":"x"}`), CreatedAt: time.Now(),
		})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				publish()
			}
		})
	}
	var served atomic.Int64
	var clients sync.WaitGroup
	for i := range 12 {
		clients.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				// Short streams, and some long enough to be served on a busy
				// machine: a stream's 200 waits for its opening token, a
				// database read, which the publishers' moving position makes
				// every opening stream ask for (one at a time).
				life := time.Duration(5+(i+j)%20) * time.Millisecond
				if i%3 == 0 {
					life *= 100
				}
				ctx, cancel := context.WithTimeout(context.Background(), life)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.url+sse.Path, nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					if resp.StatusCode == http.StatusOK {
						served.Add(1)
					}
					if i%2 == 0 { // half of them read, the others never do
						sc := bufio.NewScanner(resp.Body)
						for sc.Scan() {
						}
					}
					_ = resp.Body.Close()
				}
				cancel()
			}
		})
	}
	// Close amid served streams: on a busy machine the first 200 can take
	// longer than the hammering would otherwise last.
	time.Sleep(700 * time.Millisecond)
	require.Eventually(t, func() bool { return served.Load() > 0 }, 30*time.Second, 10*time.Millisecond, "no client was served")
	closed := make(chan struct{})
	go func() { b.hub.Close(); close(closed) }()
	go b.hub.Close() // Close is idempotent, also concurrently
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	clients.Wait()
	require.Eventually(t, func() bool { return b.hub.Clients() == 0 }, wait, 10*time.Millisecond)
	publish() // after Close: ignored, never blocks
}
