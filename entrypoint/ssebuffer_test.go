package entrypoint_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestSSEBufferCoversTheDispatcherBatch: with KUMIKO_DISPATCHER_BATCH_SIZE
// above the hub's default buffer (1024 frames per client), one pass of the
// SSE consumer publishes more of a tenant's events at once than that. A
// client that reads promptly must get all of them on the same stream, not
// be dropped for the size of the burst (it was: the hub refuses a round
// that does not fit a client's buffer).
func TestSSEBufferCoversTheDispatcherBatch(t *testing.T) {
	t.Parallel()
	const batch, n = 3000, 6000
	var feat *orders.Feature
	app, url := readsAppWith(t, "all-in-one", kumikotest.NewDB(t), map[string]string{"KUMIKO_DISPATCHER_BATCH_SIZE": strconv.Itoa(batch)},
		func(r *framework.Registry) { feat = orders.Register(r) })

	tenant := readsTenant()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+sse.Path+"?types=orders:event:placed", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+readsToken(t, tenant))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Eventually(t, func() bool { return app.Hub().Clients() == 1 }, 10*time.Second, 10*time.Millisecond)

	// One transaction: the events become visible at once, and each pass
	// publishes up to the batch size of them together.
	_, err = app.Runtime().InTx(t.Context(), tenant, framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
		for range n {
			id := uuid.NewString()
			if err := tx.Append(framework.Stream{Type: orders.StreamType, ID: id}, framework.NoStream,
				feat.Placed.With(orders.Placed{OrderID: id, Customer: "Ada", AmountCents: 1})); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	rd := sse.NewReader(resp.Body)
	open, err := rd.Next()
	require.NoError(t, err)
	require.Equal(t, sse.OpenEvent, open.Type)
	for i := range n {
		ev, err := rd.Next()
		require.NoError(t, err, "the stream ended after %d of %d events", i, n)
		require.Equal(t, "orders:event:placed", ev.Type)
	}
	require.InDelta(t, 0, metric(t, app, "kumiko_sse_dropped_clients_total"), 0)
}
