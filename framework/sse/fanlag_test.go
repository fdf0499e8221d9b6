package sse_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestFanOutLagDropsNoOne: a client that keeps up must take whatever one
// dispatcher pass publishes (its buffer holds two batches), whatever the
// hub's fan-out goroutine does meanwhile. While the fan-out is held up (a
// slow upcaster: an event of an older schema during a roll), later passes'
// events pile up behind it; they must not reach the client as one round
// larger than its buffer, which dropped every client of the tenant, fast
// ones included, as if each were slow.
func TestFanOutLagDropsNoOne(t *testing.T) {
	t.Parallel()
	b, h := setupSlowUpcaster(t)
	entered, release := h.entered, h.release
	defer release()
	c := b.connect(t, request{tenant: "t-lag"})
	apply := b.hub.Consumer().Apply
	env := func(pos int64, payload string) framework.Envelope { return h.env("t-lag", pos, payload) }
	const n = 3000 // six passes of the default batch (500), beyond the buffer (1024)
	require.NoError(t, apply(context.Background(), nil, env(1<<40, `{"slow":true}`)))
	<-entered
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i := range int64(n) {
			_ = apply(context.Background(), nil, env(1<<40+1+i, `{"fast":true}`))
		}
	}()
	// Passes pile up behind the held fan-out: more than the buffer, or as
	// many as Publish lets wait before it holds the passes back.
	limit := min(1100, sse.MaxPending(b.hub))
	eventually(t, "events waiting for the fan-out", func() bool { return sse.Pending(b.hub) >= limit })
	release()
	c.waitFor(t, n+1)
	<-published
	require.Zero(t, b.metric(t, "kumiko_sse_dropped_clients_total"), "a client that keeps up was dropped")
}
