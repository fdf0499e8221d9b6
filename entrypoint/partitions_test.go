package entrypoint_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestWorkerRefusesPartitionsThatDoNotLineUp: a worker whose code declares
// another partition count than the stored rows, which do not line up,
// does not start delivering (some events would be delivered twice or
// never): Serve returns the dispatcher's refusal, which names the way out.
func TestWorkerRefusesPartitionsThatDoNotLineUp(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	var ev framework.EventType[struct{}]
	features := func(partitions int) func(r *framework.Registry) {
		return func(r *framework.Registry) {
			f := r.Feature("parts")
			ev = framework.DefineEvent[struct{}](f, "pinged", nil)
			p := framework.MultiStreamProjection(f, "counter", &framework.ProjectionOptions{Partitions: partitions})
			framework.On(p, ev, func(context.Context, *framework.Tx, framework.Event[struct{}]) error { return nil })
		}
	}
	// Two partitions: partition 0 delivered every event of its streams,
	// partition 1 none.
	reg := framework.NewRegistry()
	features(2)(reg)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	for i := range 12 {
		_, err := rt.InTx(context.Background(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: fmt.Sprint(i)}, framework.AnyVersion, ev.With(struct{}{}))
		})
		require.NoError(t, err)
	}
	db.WaitVisible(t)
	d, err := dispatcher.New(db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "old"})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	for {
		n, err := d.RunOnce(context.Background(), "parts:counter@0")
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}

	cfg := newConfig(t, map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
		"WORKER_HTTP_ADDR": "127.0.0.1:0"})
	app, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: features(3)})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- app.Serve(context.Background(), ln) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, dispatcher.ErrLayout)
		require.ErrorContains(t, err, "parts:counter@1")
		require.ErrorContains(t, err, "kumiko projection rebuild parts:counter")
	case <-time.After(wait):
		t.Fatal("the worker kept running with partitions that do not line up")
	}
	require.Equal(t, entrypoint.StateStopped, app.State())
}
