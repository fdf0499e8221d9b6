package entrypoint_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
)

// TestDrainTimeoutCutsStalledRequests: when the drain timeout fires, Serve
// cuts the connections of the requests still running, so their contexts
// end and they give their database connections back, and the shutdown
// hooks (which close the pools) run; before, such a request ran on
// unbounded after Serve returned ErrDrainTimeout, with the pools open.
func TestDrainTimeoutCutsStalledRequests(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
		"KUMIKO_DRAIN_TIMEOUT_MS": "300"})
	entered, ended := make(chan struct{}), make(chan struct{})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register, InstanceID: "drain-cut",
		Routes: func(ws *web.Server) {
			ws.Echo().GET("/stall", func(c echo.Context) error {
				close(entered)
				<-c.Request().Context().Done()
				close(ended)
				return nil
			})
		}})
	waitServedReady(t, s)
	hooksRan := make(chan struct{})
	s.app.OnShutdown(func(context.Context) error { close(hooksRan); return nil })
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, s.url+"/stall", nil)
		if resp, err := httpClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	require.ErrorIs(t, s.stop(t), entrypoint.ErrDrainTimeout)
	for _, ch := range []chan struct{}{ended, hooksRan} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("the stalled request still runs (or the hooks did not run) after the drain timeout")
		}
	}
}

// TestDrainTimeoutNamesWhatItCutOff: the drain timeout's error names the
// step the drain was waiting for, here a shutdown hook that does not
// return, and still matches ErrDrainTimeout.
func TestDrainTimeoutNamesWhatItCutOff(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
		"KUMIKO_DRAIN_TIMEOUT_MS": "300"})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register, InstanceID: "drain-cut-hook"})
	waitServedReady(t, s)
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	s.app.OnShutdown(func(context.Context) error { <-unblock; return nil })
	err := s.stop(t)
	require.ErrorIs(t, err, entrypoint.ErrDrainTimeout)
	require.EqualError(t, err, "entrypoint: drain timeout exceeded after 300ms: "+
		"the shutdown hooks were still running (they close the pools and clients)")
}

// failingListener accepts nothing; its Accept fails with err once fail is
// closed, which stops the HTTP server: a process failure.
type failingListener struct {
	net.Listener
	fail chan struct{}
	err  error
}

func (l *failingListener) Accept() (net.Conn, error) {
	<-l.fail
	return nil, l.err
}

// TestDrainTimeoutKeepsTheProcessFailure: a process that failed (here its
// HTTP server) and then overran its drain returns both errors, the failure
// first; the failure was only logged, and the exit said only that the
// drain timed out, hiding why the process stopped.
func TestDrainTimeoutKeepsTheProcessFailure(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
		"KUMIKO_DRAIN_TIMEOUT_MS": "300"})
	app, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: features.Register, InstanceID: "drain-cut-failed"})
	require.NoError(t, err)
	unblock := make(chan struct{})
	t.Cleanup(func() { close(unblock) })
	app.OnShutdown(func(context.Context) error { <-unblock; return nil })
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = inner.Close() })
	boom := errors.New("accept: the listener broke")
	ln := &failingListener{Listener: inner, fail: make(chan struct{}), err: boom}
	done := make(chan error, 1)
	go func() { done <- app.Serve(context.Background(), ln) }()
	close(ln.fail)
	select {
	case err = <-done:
	case <-time.After(wait):
		t.Fatal("Serve did not return")
	}
	require.ErrorIs(t, err, boom, "the process failure is kept")
	require.ErrorIs(t, err, entrypoint.ErrDrainTimeout)
	require.EqualError(t, err, "http: accept: the listener broke; then entrypoint: drain timeout exceeded after 300ms: "+
		"the shutdown hooks were still running (they close the pools and clients)")
}
