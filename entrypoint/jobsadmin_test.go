package entrypoint_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// serveJobsApp serves an all-in-one app with the sample features and the
// ops-test job (healthy: whether its runs succeed) until the test ends,
// and returns it with its base URL.
func serveJobsApp(t *testing.T, instance string, healthy *atomic.Bool) (*entrypoint.App, string) {
	t.Helper()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	app, err := entrypoint.New(context.Background(), entrypoint.Options{
		Config: jobsConfig(t, "all-in-one", db.URL, rds.URL), Register: jobsTestFeature(healthy), InstanceID: instance,
	})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return app, "http://" + ln.Addr().String()
}

// serveJobsAdmin serves an all-in-one app with the jobs admin API and
// returns its base URL and an admin token of tenant acme.
func serveJobsAdmin(t *testing.T) (base, admin string) {
	t.Helper()
	var healthy atomic.Bool
	_, base = serveJobsApp(t, "jobs-admin-input", &healthy)
	return base, jobsToken(t, keyring(t), "acme", "admin")
}

// TestJobsAdminBadInput: the jobs admin API's answers to bad input.
func TestJobsAdminBadInput(t *testing.T) {
	t.Parallel()
	base, admin := serveJobsAdmin(t)
	errorOf := func(res map[string]any) map[string]any {
		t.Helper()
		e, ok := res["error"].(map[string]any)
		require.True(t, ok, "want an error envelope: %v", res)
		return e
	}

	t.Run("a long run id is repeated as an excerpt", func(t *testing.T) {
		long := strings.Repeat("x", 10<<10)
		code, res := jobsCall(t, "POST", base+"/api/admin/jobs/api/"+long+"/retry", admin, nil)
		require.Equal(t, http.StatusNotFound, code)
		msg := errorOf(res)["message"].(string)
		require.Less(t, len(msg), 1000, "the message repeats the whole id: %.300s", msg)
		require.True(t, strings.Contains(msg, long[:100]), "the message still names the id: %.300s", msg)
	})

	t.Run("a repeated query parameter is refused", func(t *testing.T) {
		for _, q := range []string{"state=archived&state=pending", "lane=api&lane=worker", "limit=5&limit=10", "lane=api&lane=api"} {
			code, res := jobsCall(t, "GET", base+"/api/admin/jobs?"+q, admin, nil)
			require.Equal(t, http.StatusBadRequest, code, q)
			e := errorOf(res)
			require.Equal(t, "bad_request", e["code"], q)
			require.Contains(t, e["message"], strings.SplitN(q, "=", 2)[0], q)
		}
	})

	t.Run("a blank selector is refused, not read as every state or lane", func(t *testing.T) {
		for _, q := range []string{"state=", "lane=", "state=%20", "lane=%09"} {
			code, res := jobsCall(t, "GET", base+"/api/admin/jobs?"+q, admin, nil)
			require.Equal(t, http.StatusBadRequest, code, q)
			e := errorOf(res)
			require.Equal(t, "validation_error", e["code"], q)
			require.Contains(t, e["message"], strings.SplitN(q, "=", 2)[0]+" is empty", q)
		}
	})

	t.Run("the lane in the path is percent-decoded like the id", func(t *testing.T) {
		for _, lane := range []string{"ap%69", "%61pi", "w%6Frker"} {
			code, res := jobsCall(t, "POST", base+"/api/admin/jobs/"+lane+"/no-such-run/retry", admin, nil)
			require.Equal(t, http.StatusNotFound, code, "%s: %v", lane, res)
			require.Contains(t, errorOf(res)["message"], "no job run no-such-run in the", lane)
		}
		code, _ := jobsCall(t, "POST", base+"/api/admin/jobs/ap%2F/no-such-run/retry", admin, nil)
		require.Equal(t, http.StatusBadRequest, code, "an escaped lane that is no lane")
	})
}

// TestJobsAdminRoutesExistBeforeServe: App.Web's handler has the jobs admin
// routes from New on. They were added by Serve, to a handler that may be
// serving already (a data race), and echo sizes each pooled request context
// for the route parameters known when it was made, so a context made before
// the two-parameter retry route panicked when routed to it (500).
func TestJobsAdminRoutesExistBeforeServe(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	var healthy atomic.Bool
	app, err := entrypoint.New(context.Background(), entrypoint.Options{
		Config: jobsConfig(t, "all-in-one", db.URL, rds.URL), Register: jobsTestFeature(&healthy), InstanceID: "jobs-admin-before-serve",
	})
	require.NoError(t, err)
	defer app.Close(context.Background())
	srv := httptest.NewServer(app.Web().Handler())
	defer srv.Close()
	admin := jobsToken(t, keyring(t), "acme", "admin")
	code, res := jobsCall(t, "GET", srv.URL+"/api/admin/jobs?state=archived", admin, nil)
	require.Equal(t, http.StatusOK, code, "%v", res)
	code, res = jobsCall(t, "POST", srv.URL+"/api/admin/jobs/worker/no-such-run/retry", admin, nil)
	require.Equal(t, http.StatusNotFound, code, "%v", res)
	require.NotContains(t, fmt.Sprint(res), "no route", "the retry route exists")
}
