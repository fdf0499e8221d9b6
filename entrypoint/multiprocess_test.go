package entrypoint_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// tenantLog returns the cursors of tenant's events in delivery order.
func tenantLog(t *testing.T, db *kumikotest.DB, tenant string) []string {
	t.Helper()
	return tenantLogOf(t, db, tenant, "")
}

// TestMultiProcess runs the real topology: two API processes and a worker
// on one database and one Redis. A client on each API sees every event
// written through either. Then the API serving one client is killed with
// SIGKILL while writes go on; the client reconnects to the other API with
// its last id and misses nothing, and gets nothing twice.
func TestMultiProcess(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	api1 := start(t, "api-1", procEnv("api", db.URL, rds.URL, "api-1"))
	api2 := start(t, "api-2", procEnv("api", db.URL, rds.URL, "api-2"))
	worker := start(t, "worker", procEnv("worker", db.URL, rds.URL, "worker-1"))
	api1.waitReady(t)
	api2.waitReady(t)
	worker.waitReady(t)

	c1, err := openStream(t, api1.url, "acme", "", "")
	require.NoError(t, err)
	c2, err := openStream(t, api2.url, "acme", "", "")
	require.NoError(t, err)

	// Writes through both APIs reach both clients.
	for i := range 6 {
		via := api1
		if i%2 == 1 {
			via = api2
		}
		via.place(t, "acme", fmt.Sprintf("both-%d", i))
	}
	want := tenantLog(t, db, "acme")
	require.Len(t, want, 6)
	require.Equal(t, want, ids(c1.waitFor(t, 6)))
	require.Equal(t, want, ids(c2.waitFor(t, 6)))

	// Writers keep going through api2 while api1 is killed.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			code, body, err := post(ctx, t, api2.url+"/api/write", "acme",
				map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": fmt.Sprintf("during-%d", i), "amountCents": 1}})
			cancel()
			if err == nil && code != 200 {
				err = fmt.Errorf("write answered %d: %s", code, body)
			}
			if err != nil {
				writeErr = err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(200 * time.Millisecond)
	api1.kill()
	require.Error(t, c1.ended(t, 5*time.Second), "the stream of the killed process ends")
	got, _ := c1.snapshot()
	last := got[len(got)-1].ID
	time.Sleep(200 * time.Millisecond) // events the client missed meanwhile

	// The client fails over to api2 with its last id.
	r, err := openStream(t, api2.url, "acme", "", last)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	require.NoError(t, writeErr)
	api2.place(t, "acme", "after")
	want = tenantLog(t, db, "acme")
	all := append(got, r.waitFor(t, len(want)-len(got))...)
	require.Equal(t, want, ids(all))
	time.Sleep(100 * time.Millisecond)
	more, _ := r.snapshot()
	require.Len(t, more, len(want)-len(got), "no duplicates after the failover")
	// And the other client saw everything too.
	require.Equal(t, want, ids(c2.waitFor(t, len(want))))

	// The worker ran the shared projection for all of it.
	deadline := time.Now().Add(wait)
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(orders), 0) FROM order_totals`).Scan(&n))
		if n == len(want) {
			break
		}
		require.True(t, time.Now().Before(deadline), "order totals %d, want %d", n, len(want))
		time.Sleep(20 * time.Millisecond)
	}
}
