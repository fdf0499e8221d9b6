package entrypoint_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestWorkerPortAnswersInTheErrorEnvelope: the worker's health and metrics
// port answers an unknown path, and a wrong method, in the framework's
// error envelope like every other Kumiko port; it answered echo's own
// {"message":"Not Found"}. As on the API port, every answer carries an
// X-Request-ID, and the envelope's requestId is that id: the worker's
// port answered "requestId":"" and no header.
func TestWorkerPortAnswersInTheErrorEnvelope(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register, InstanceID: "worker-port-1"})
	waitServedReady(t, s)
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{http.MethodGet, "/api/write", http.StatusNotFound, "not_found"},
		{http.MethodPost, "/health/ready", http.StatusMethodNotAllowed, "method_not_allowed"},
	} {
		req, err := http.NewRequestWithContext(context.Background(), tc.method, s.url+tc.path, nil)
		require.NoError(t, err)
		resp, err := httpClient.Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, tc.status, resp.StatusCode, "%s %s: %s", tc.method, tc.path, body)
		var env struct {
			Error struct {
				Code      string `json:"code"`
				Message   string `json:"message"`
				RequestID string `json:"requestId"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal(body, &env), "%s", body)
		require.Equal(t, tc.code, env.Error.Code, "%s", body)
		require.NotEmpty(t, env.Error.Message)
		require.NotEmpty(t, env.Error.RequestID, "%s", body)
		require.Equal(t, env.Error.RequestID, resp.Header.Get("X-Request-ID"))
	}
	for _, path := range []string{"/health/live", "/health/ready", "/metrics"} {
		resp, err := httpClient.Get(s.url + path) //nolint:noctx // a test's probe
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.NotEmpty(t, resp.Header.Get("X-Request-ID"), path)
	}
	require.NoError(t, s.stop(t))
}
