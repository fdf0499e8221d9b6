package entrypoint_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestAdminMaintenanceMounted: the API process serves the maintenance
// verbs of framework/admin with the application's registry.
func TestAdminMaintenanceMounted(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
		"KUMIKO_RUN_LOCAL_JOBS": "true"})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register, InstanceID: "admin-api"})
	waitServedReady(t, s)
	tok := jobsToken(t, keyring(t), "acme", "admin")
	call := func(method, path, body string) (int, map[string]any) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, s.url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := httpClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
		return res.StatusCode, out
	}
	code, out := call(http.MethodGet, "/api/admin/migrations", "")
	require.Equal(t, http.StatusOK, code, out)
	require.EqualValues(t, 0, out["data"].(map[string]any)["pending"])
	code, out = call(http.MethodPost, "/api/admin/events/prune", `{"olderThanDays": 30, "dryRun": true}`)
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, []any{"jobs:event:dispatched"}, out["data"].(map[string]any)["types"])
	// Beside the jobs admin routes (/api/admin/jobs/:lane/:id/retry).
	code, out = call(http.MethodPost, "/api/admin/jobs/handled/prune", `{"olderThanDays": 90}`)
	require.Equal(t, http.StatusOK, code, out)
	require.EqualValues(t, 0, out["data"].(map[string]any)["deleted"])
	code, out = call(http.MethodPost, "/api/admin/dead-letters/prune", `{"olderThanDays": 90}`)
	require.Equal(t, http.StatusOK, code, out)
	require.EqualValues(t, 0, out["data"].(map[string]any)["deleted"])
	code, out = call(http.MethodPost, "/api/admin/projections/users:send-welcome-email/rebuild", "")
	require.Equal(t, http.StatusConflict, code, out)
	code, out = call(http.MethodPost, "/api/admin/projections/orders:order-totals/rebuild", "")
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, "orders:order-totals", out["data"].(map[string]any)["projection"])
}
