package entrypoint_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestWorkerAnswersHealthWhileDraining: a worker's health server stays up
// while the worker drains (here: a projection pass that takes its time), so
// /health/ready answers 503 with the state draining at once and
// /health/live answers 200 while the process runs; the drain then ends
// cleanly once the pass is done.
func TestWorkerAnswersHealthWhileDraining(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	register := func(r *framework.Registry) {
		o := orders.Register(r)
		p := framework.MultiStreamProjection(r.Feature("slow-drain"), "slow", &framework.ProjectionOptions{RunIn: framework.RunInWorker})
		framework.On(p, o.Placed, func(context.Context, *framework.Tx, framework.Event[orders.Placed]) error {
			once.Do(func() { close(entered) })
			<-release
			return nil
		})
	}
	cfg := newConfig(t, map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "50"})
	s := serve(t, entrypoint.Options{Config: cfg, Register: register, InstanceID: "worker-drain-1"})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	waitServedReady(t, s)

	_, err := s.app.Runtime().Write(context.Background(), framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}},
		[]framework.Command{{Type: "orders:write:place", Payload: []byte(`{"customer":"slow","amountCents":1}`)}})
	require.NoError(t, err)
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the projection never ran")
	}

	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	code, body, err := get(ctx, s.url+"/health/ready")
	require.NoError(t, err, "a draining worker still answers its readiness probe")
	require.Equal(t, http.StatusServiceUnavailable, code, string(body))
	var r readiness
	require.NoError(t, json.Unmarshal(body, &r), string(body))
	require.Equal(t, "draining", r.State)
	code, _, err = get(ctx, s.url+"/health/live")
	require.NoError(t, err, "a draining worker still answers its liveness probe")
	require.Equal(t, http.StatusOK, code)

	released = true
	close(release)
	select {
	case err := <-s.done:
		s.done <- err
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("the worker did not finish draining")
	}
	require.Equal(t, entrypoint.StateStopped, s.app.State())
}
