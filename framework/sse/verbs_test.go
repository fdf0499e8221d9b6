package sse_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestVerbsDoNotTakeEventsFromLiveStreams: the hub's consumer row feeds
// the live streams of its process. A skip while it is healthy moves its
// cursor past its next event: the hub never gets it, and the live clients
// of the process miss it without knowing (nothing makes them resume). A
// disable leaves them open on heartbeats alone. Both are refused with a
// message that says so, and the live client gets every event, once, in
// order.
func TestVerbsDoNotTakeEventsFromLiveStreams(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	c := b.connect(t, request{tenant: "acme"})
	// Writes that do not wake the dispatcher: it finds them on its next
	// poll, so a skip right after one finds the event still ahead of its
	// cursor.
	quiet, err := framework.NewRuntime(b.reg, b.db.Pool, nil)
	require.NoError(t, err)
	n := 0
	for ; n < 50; n++ {
		_, err := quiet.InTx(ctx, "acme", framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream, b.noted.With(Noted{N: n}))
		})
		require.NoError(t, err)
		_, err = dispatcher.Skip(ctx, b.pool, sse.ConsumerName, b.inst)
		if errors.Is(err, dispatcher.ErrNothingToSkip) {
			continue // delivered already
		}
		require.Error(t, err, "a skip of the healthy SSE consumer passed over an event its live clients never get")
		require.ErrorIs(t, err, dispatcher.ErrLiveStreamConsumer)
		require.Contains(t, err.Error(), "feeds the live SSE streams")
		break
	}
	err = dispatcher.Disable(ctx, b.pool, sse.ConsumerName, b.inst)
	require.ErrorIs(t, err, dispatcher.ErrLiveStreamConsumer)
	require.Contains(t, err.Error(), "drain")
	st, err := dispatcher.Status(ctx, b.pool, sse.ConsumerName, b.inst)
	require.NoError(t, err)
	// The refused disable left the consumer running: idle, or in a pass
	// of the events just written.
	require.Contains(t, []dispatcher.State{dispatcher.StateIdle, dispatcher.StateProcessing}, st.Status)
	require.Empty(t, st.DeadLetters)

	b.note(t, "acme", "memo", 1000, "after")
	want := b.logOf(t, "acme")
	require.Equal(t, want, ids(c.waitFor(t, len(want))), "every event once, in order")
}
