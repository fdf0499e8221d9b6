package entrypoint_test

import (
	"context"
	"net"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestRunReleasesOnListenFailure: Run that cannot listen (the address is
// taken) returns the error with the App's pools and clients closed, as Run
// promises for every return, and the state stopped.
func TestRunReleasesOnListenFailure(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	cfg := newConfig(t, map[string]string{"APP_MODE": "all-in-one", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL, "HTTP_ADDR": taken.Addr().String()})
	app, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: features.Register})
	require.NoError(t, err)
	require.ErrorContains(t, app.Run(context.Background()), "listen")
	require.Equal(t, entrypoint.StateStopped, app.State())
	require.Error(t, app.Pool().Ping(context.Background()), "the pool is closed")
	require.ErrorIs(t, app.Redis().Ping(context.Background()).Err(), redis.ErrClosed)
}
