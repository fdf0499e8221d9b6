package entrypoint_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
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
	db := kumikotest.NewDB(t)
	vars := map[string]string{"APP_MODE": "all-in-one", "DATABASE_URL": db.URL, "JWT_SECRET": readsSecret,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "20", "KUMIKO_DISPATCHER_BATCH_SIZE": "3000",
		"HTTP_ADDR": "127.0.0.1:0", "WORKER_HTTP_ADDR": "127.0.0.1:0"}
	cfg, err := config.FromLookup(func(k string) (string, bool) { v, ok := vars[k]; return v, ok })
	require.NoError(t, err)
	require.Equal(t, batch, cfg.DispatcherBatchSize)
	var feat *orders.Feature
	app, err := entrypoint.New(t.Context(), entrypoint.Options{Config: cfg,
		Register: func(r *framework.Registry) { feat = orders.Register(r) }})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "http://" + ln.Addr().String()

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
	for i := range n {
		ev, err := rd.Next()
		require.NoError(t, err, "the stream ended after %d of %d events", i, n)
		require.Equal(t, "orders:event:placed", ev.Type)
	}
	require.InDelta(t, 0, metric(t, app, "kumiko_sse_dropped_clients_total"), 0)
}
