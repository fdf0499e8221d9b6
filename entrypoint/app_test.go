package entrypoint_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// newConfig reads a configuration from env (JWT_SECRET and a quick poll
// interval added).
func newConfig(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	env["JWT_SECRET"] = jwtSecret
	cfg, err := config.FromLookup(func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	require.NoError(t, err)
	return cfg
}

// served is an App serving on a loopback listener.
type served struct {
	app    *entrypoint.App
	url    string
	cancel context.CancelFunc
	done   chan error
}

// serve builds an App of opts and serves it until the test ends (or stop).
func serve(t *testing.T, opts entrypoint.Options) *served {
	t.Helper()
	app, err := entrypoint.New(context.Background(), opts)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{app: app, url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// stop cancels the App's context and returns Serve's result.
func (s *served) stop(t *testing.T) error {
	t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err // for the cleanup
		return err
	case <-time.After(wait):
		t.Fatal("Serve did not return")
		return nil
	}
}

// TestWorkerWithNothingToRun: a worker whose features declare no consumer
// and no job for it refuses to boot.
func TestWorkerWithNothingToRun(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL})
	// Only an api-side projection and no job: nothing for a worker.
	noJobs := func(r *framework.Registry) {
		f := r.Feature("api-only")
		ev := framework.DefineEvent[struct{}](f, "pinged", nil)
		p := framework.MultiStreamProjection(f, "api-side", &framework.ProjectionOptions{RunIn: framework.RunInAPI})
		framework.On(p, ev, func(context.Context, *framework.Tx, framework.Event[struct{}]) error { return nil })
	}
	_, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: noJobs})
	require.ErrorContains(t, err, "worker has nothing to run")

	// The same features boot as an API process.
	cfg = newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL})
	app, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: noJobs})
	require.NoError(t, err)
	require.NotNil(t, app.Hub())
	app.Close(context.Background())
	require.Equal(t, entrypoint.StateStopped, app.State())
}

// TestShutdownHooksRunInReverse: hooks run after the server stopped, last
// registered first, and Serve returns nil on a clean shutdown with the
// state stopped.
func TestShutdownHooksRunInReverse(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "all-in-one", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register})
	var mu sync.Mutex
	var order []string
	for _, name := range []string{"first", "second", "third"} {
		s.app.OnShutdown(func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, name)
			if name == "second" {
				return errors.New("a failing hook does not stop the others")
			}
			return nil
		})
	}
	waitServedReady(t, s)
	require.NoError(t, s.stop(t))
	require.Equal(t, []string{"third", "second", "first"}, order)
	require.Equal(t, entrypoint.StateStopped, s.app.State())
}

// waitServedReady waits for /health/ready of an in-process App.
func waitServedReady(t *testing.T, s *served) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		code, _, err := get(ctx, s.url+"/health/ready")
		cancel()
		if err == nil && code == http.StatusOK {
			return
		}
		require.True(t, time.Now().Before(deadline), "not ready: %d %v", code, err)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDevToken: GET /dev/token exists only in all-in-one mode with
// KUMIKO_DEV=1; the token it hands out (also as the kumiko_auth cookie)
// works for the dev tenant.
func TestDevToken(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cases := []struct {
		mode, dev string
		mounted   bool
	}{
		{"all-in-one", "1", true},
		{"all-in-one", "", false},
		{"all-in-one", "false", false},
		{"api", "1", false},
	}
	for _, tc := range cases {
		t.Run(tc.mode+" dev="+tc.dev, func(t *testing.T) {
			t.Parallel()
			cfg := newConfig(t, map[string]string{"APP_MODE": tc.mode, "KUMIKO_DEV": tc.dev, "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
				"KUMIKO_RUN_LOCAL_JOBS": "true"})
			s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register, InstanceID: "dev-" + tc.mode + tc.dev})
			waitServedReady(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+entrypoint.DevTokenPath, nil)
			require.NoError(t, err)
			resp, err := httpClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			if !tc.mounted {
				require.Equal(t, http.StatusNotFound, resp.StatusCode)
				return
			}
			require.Equal(t, http.StatusOK, resp.StatusCode)
			var dt entrypoint.DevToken
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&dt))
			require.Equal(t, entrypoint.DevTenant, dt.TenantID)
			p, err := keyring(t).Verify(dt.Token)
			require.NoError(t, err)
			require.Equal(t, entrypoint.DevTenant, p.TenantID)
			var cookie *http.Cookie
			for _, c := range resp.Cookies() {
				if c.Name == "kumiko_auth" {
					cookie = c
				}
			}
			require.NotNil(t, cookie)
			require.Equal(t, dt.Token, cookie.Value)
			require.True(t, cookie.HttpOnly)
			// The cookie authenticates a query of the dev tenant.
			q, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/api/query",
				strings.NewReader(`{"type":"orders:query:list","payload":{}}`))
			require.NoError(t, err)
			q.Header.Set("Content-Type", "application/json")
			q.AddCookie(cookie)
			qr, err := httpClient.Do(q)
			require.NoError(t, err)
			qr.Body.Close()
			require.Equal(t, http.StatusOK, qr.StatusCode)
		})
	}
}

// TestReadyMaxLag: with KUMIKO_READY_MAX_LAG (or Options.ReadyMaxLag, which
// wins), readiness fails while a consumer of the process is further behind,
// and recovers when it caught up.
func TestReadyMaxLag(t *testing.T) {
	t.Parallel()
	t.Run("environment", func(t *testing.T) {
		t.Parallel()
		testReadyMaxLag(t, map[string]string{"KUMIKO_READY_MAX_LAG": "3"}, 0)
	})
	t.Run("option", func(t *testing.T) {
		t.Parallel()
		testReadyMaxLag(t, map[string]string{"KUMIKO_READY_MAX_LAG": "1000"}, 3)
	})
}

func testReadyMaxLag(t *testing.T, env map[string]string, option int64) {
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	env["APP_MODE"], env["DATABASE_URL"], env["REDIS_URL"] = "all-in-one", db.URL, rds.URL
	cfg := newConfig(t, env)
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register, ReadyMaxLag: option})
	waitServedReady(t, s)
	// Park the order-totals consumer and write past the limit.
	_, err := db.Pool.Exec(context.Background(), `UPDATE event_consumers SET status = 'dead' WHERE name = 'orders:projection:order-totals' OR name LIKE '%order-totals'`)
	require.NoError(t, err)
	for range 5 {
		_, err := s.app.Runtime().Write(context.Background(), framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}},
			[]framework.Command{{Type: "orders:write:place", Payload: []byte(`{"customer":"c","amountCents":1}`)}})
		require.NoError(t, err)
	}
	r := s.app.Ready(context.Background())
	require.Equal(t, "unavailable", r.Status)
	var lag *entrypoint.Check
	for i := range r.Checks {
		if r.Checks[i].Name == "consumer_lag" {
			lag = &r.Checks[i]
		}
	}
	require.NotNil(t, lag)
	require.False(t, lag.OK)
	require.Contains(t, lag.Error, "order-totals lags more than 3 events")
	_, err = db.Pool.Exec(context.Background(), `UPDATE event_consumers SET status = 'idle' WHERE name LIKE '%order-totals'`)
	require.NoError(t, err)
	s.app.Dispatcher().Wake()
	waitServedReady(t, s)
}

// TestReadinessOffWhileDraining: the moment the context ends, the state is
// draining and readiness answers unavailable, while an in-flight request
// still runs to completion.
func TestReadinessOffWhileDraining(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register})
	waitServedReady(t, s)
	require.Equal(t, entrypoint.StateReady, s.app.State())

	release := blockOrders(t, db)
	result := slowPlace(t, &proc{url: s.url})
	waitBlocked(t, db)
	s.cancel()
	deadline := time.Now().Add(2 * time.Second)
	for s.app.State() != entrypoint.StateDraining {
		require.True(t, time.Now().Before(deadline), "state %s", s.app.State())
		time.Sleep(time.Millisecond)
	}
	r := s.app.Ready(context.Background())
	require.Equal(t, "unavailable", r.Status)
	require.Equal(t, entrypoint.StateDraining, r.State)
	release()
	require.Equal(t, http.StatusOK, <-result)
	require.NoError(t, s.stop(t))
	require.Equal(t, entrypoint.StateStopped, s.app.State())
}

// TestBadInstanceIDOption: Options.InstanceID is checked as
// KUMIKO_INSTANCE_ID is; it skipped the check, so an id with '/' (which no
// admin path can name) or the shared consumers' reserved id booted.
func TestBadInstanceIDOption(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL})
	for _, id := range []string{"pods/api-1", "__shared__", strings.Repeat("x", 254)} {
		_, err := entrypoint.New(context.Background(), entrypoint.Options{Config: cfg, Register: features.Register, InstanceID: id})
		require.ErrorContains(t, err, "entrypoint: InstanceID:", "id %q", id)
	}
}
