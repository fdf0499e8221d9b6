package entrypoint_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestKeyedWriteWithRedisDownIsRefusedWithinItsBound: with the process's
// own Redis settings, a keyed write while Redis refuses connections is
// answered 503 idempotency_unavailable within its claim's bound (2 s, plus
// a margin for a loaded machine), not held for go-redis's retries of
// retries, and does not run.
func TestKeyedWriteWithRedisDownIsRefusedWithinItsBound(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register})
	waitServedReady(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	place := map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 100}}
	code, body, err := post(ctx, t, s.url+"/api/write", "acme", place, "Idempotency-Key", "up-1")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "%s", body)

	rds.Stop()
	for i, key := range []string{"down-1", "down-2", "down-3"} {
		start := time.Now()
		code, body, err = post(ctx, t, s.url+"/api/write", "acme", place, "Idempotency-Key", key)
		took := time.Since(start)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
		require.Contains(t, string(body), `"code":"idempotency_unavailable"`)
		require.Less(t, took, idempotency.DefaultCallTimeout+time.Second, "keyed write %d with Redis down answered after %s", i, took)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE customer = 'Ada'`).Scan(&n))
	require.Equal(t, 1, n, "only the write made while Redis was up ran")
}
