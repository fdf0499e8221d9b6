package entrypoint_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestCloseTwiceAndAfterServe: Close called concurrently, and again after
// Serve returned, runs the shutdown hooks once (pools and clients are
// closed once: no panic) and leaves the App stopped.
func TestCloseTwiceAndAfterServe(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "all-in-one", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})

	app, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: features.Register})
	require.NoError(t, err)
	var ran atomic.Int32
	app.OnShutdown(func(context.Context) error { ran.Add(1); return nil })
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { app.Close(context.Background()) })
	}
	wg.Wait()
	require.Equal(t, int32(1), ran.Load())
	require.Equal(t, entrypoint.StateStopped, app.State())

	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register})
	ran.Store(0)
	s.app.OnShutdown(func(context.Context) error { ran.Add(1); return nil })
	waitServedReady(t, s)
	require.NoError(t, s.stop(t))
	s.app.Close(context.Background())
	require.Equal(t, int32(1), ran.Load())
	require.Equal(t, entrypoint.StateStopped, s.app.State())
}
