package entrypoint_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// jobsConfig is the configuration of an in-process test app.
func jobsConfig(t *testing.T, mode, dbURL, redisURL string, extra ...string) *config.Config {
	t.Helper()
	env := map[string]string{
		"APP_MODE": mode, "DATABASE_URL": dbURL, "REDIS_URL": redisURL, "JWT_SECRET": jwtSecret,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "50", "KUMIKO_DRAIN_TIMEOUT_MS": "10000",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	cfg, err := config.FromLookup(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	require.NoError(t, err)
	return cfg
}

// jobsTestFeature registers an api-lane manual job that fails until healthy
// is set, without retries (it is archived at once).
func jobsTestFeature(healthy *atomic.Bool) func(r *framework.Registry) {
	return func(r *framework.Registry) {
		features.Register(r)
		f := r.Feature("ops-test")
		jobs.Manual[struct {
			N int `json:"n"`
		}](f, "flaky", &jobs.Options{RunIn: framework.RunInAPI, MaxRetries: -1}, func(ctx context.Context, jc *jobs.Context, in struct {
			N int `json:"n"`
		}) error {
			if !healthy.Load() {
				return fmt.Errorf("flaky %d is not healthy yet", in.N)
			}
			return nil
		})
	}
}

// TestJobsBootValidation: each boot validation of the jobs fails New with
// a message naming the jobs.
func TestJobsBootValidation(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()

	cfg := jobsConfig(t, "worker", db.URL, "redis://127.0.0.1:1/0")
	cfg.RedisURL = ""
	_, err := entrypoint.New(ctx, entrypoint.Options{Config: cfg, Register: features.Register})
	require.ErrorContains(t, err, "but no Redis is configured: set REDIS_URL")
	require.ErrorContains(t, err, "orders:job:render-invoice, users:job:deliver-welcome-mail, users:job:nightly-report")

	var healthy atomic.Bool
	_, err = entrypoint.New(ctx, entrypoint.Options{Config: jobsConfig(t, "api", db.URL, "redis://127.0.0.1:1/0"), Register: jobsTestFeature(&healthy)})
	require.ErrorContains(t, err, "ops-test:job:flaky run in the api lane (RunIn api) but this api process does not consume it")
	require.NotContains(t, err.Error(), "orders:job:render-invoice")

	_, err = entrypoint.New(ctx, entrypoint.Options{Config: jobsConfig(t, "api", db.URL, "redis://127.0.0.1:1/0"), Register: func(r *framework.Registry) {
		features.Register(r)
		jobs.Manual[struct{}](r.Feature("ops-test"), "everywhere", &jobs.Options{RunIn: framework.RunInBoth}, func(context.Context, *jobs.Context, struct{}) error { return nil })
	}})
	require.ErrorContains(t, err, "entrypoint: features:")
	require.ErrorContains(t, err, "job ops-test:job:everywhere: runIn both is not allowed")

	// With RunLocalJobs the api process consumes the api lane: it boots,
	// and runs the lane's jobs.
	rds := jobstest.StartRedis(t)
	healthy.Store(true)
	cfg = jobsConfig(t, "api", db.URL, rds.URL, "KUMIKO_RUN_LOCAL_JOBS", "true")
	s := serve(t, entrypoint.Options{Config: cfg, Register: jobsTestFeature(&healthy)})
	require.NotNil(t, s.app.Jobs())
	require.NotContains(t, s.app.Dispatcher().Consumers(), jobs.ConsumerName, "api processes do not run the job trigger")
	waitServedReady(t, s)
	_, err = s.app.Jobs().Client().Dispatch(ctx, "ops-test:job:flaky", map[string]int{"n": 1}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	jobsEventually(t, "the api-lane run in the api process", func() bool {
		return metric(t, s.app, "kumiko_jobs_succeeded_total") == 1
	})
	require.NoError(t, s.stop(t))
}

// jobsCall posts a command (or any request) with a token and decodes the
// answer.
func jobsCall(t *testing.T, method, url, tok string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
	}
	return resp.StatusCode, out
}

func jobsToken(t *testing.T, ring *auth.Keyring, tenant string, roles ...string) string {
	t.Helper()
	tok, err := ring.Mint(auth.Principal{UserID: "alice", TenantID: tenant, Roles: roles}, time.Hour)
	require.NoError(t, err)
	return tok
}

// jobsEventually polls cond for up to 30 s.
func jobsEventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestJobsAllInOne runs the sample features in an all-in-one process: a
// placed order gets its invoice (404 until the job ran), an invitation its
// welcome mail, and an archived job is listed and retried through the
// admin API, scoped to the caller's tenant.
func TestJobsAllInOne(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	app, base := serveJobsApp(t, "jobs-all-in-one", &healthy)
	ring := keyring(t)
	acme := jobsToken(t, ring, "acme")

	// orders: render-invoice.
	code, res := jobsCall(t, "POST", base+"/api/write", acme, map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "ada", "amountCents": 12345}})
	require.Equal(t, http.StatusOK, code, res)
	orderID := res["data"].(map[string]any)["id"].(string)
	var invoice map[string]any
	jobsEventually(t, "the invoice", func() bool {
		code, res := jobsCall(t, "POST", base+"/api/query", acme, map[string]any{"type": "orders:query:invoice", "payload": map[string]any{"orderId": orderID}})
		if code == http.StatusNotFound {
			require.Equal(t, "not_found", res["error"].(map[string]any)["code"])
			return false
		}
		require.Equal(t, http.StatusOK, code, res)
		invoice = res["data"].(map[string]any)
		return true
	})
	require.Equal(t, orderID, invoice["orderId"])
	require.Equal(t, "ada", invoice["customer"])
	require.InDelta(t, 12345, invoice["amountCents"], 0)
	require.Contains(t, invoice["body"], "Total: 123.45")
	// Another tenant sees no invoice of acme's order.
	code, _ = jobsCall(t, "POST", base+"/api/query", jobsToken(t, ring, "globex"), map[string]any{"type": "orders:query:invoice", "payload": map[string]any{"orderId": orderID}})
	require.Equal(t, http.StatusNotFound, code)
	code, res = jobsCall(t, "POST", base+"/api/query", acme, map[string]any{"type": "orders:query:invoice", "payload": map[string]any{"orderId": "not-a-uuid"}})
	require.Equal(t, http.StatusBadRequest, code, res)

	// users: deliver-welcome-mail.
	code, res = jobsCall(t, "POST", base+"/api/write", acme, map[string]any{"type": "users:write:invite", "payload": map[string]any{"email": "bob@example.com"}})
	require.Equal(t, http.StatusOK, code, res)
	jobsEventually(t, "the welcome mail", func() bool {
		code, res := jobsCall(t, "POST", base+"/api/query", acme, map[string]any{"type": "users:query:sent-mail", "payload": map[string]any{}})
		require.Equal(t, http.StatusOK, code, res)
		return len(res["data"].([]any)) == 1
	})
	_, res = jobsCall(t, "POST", base+"/api/query", acme, map[string]any{"type": "users:query:sent-mail", "payload": map[string]any{}})
	require.Equal(t, "bob@example.com", res["data"].([]any)[0].(map[string]any)["to"])
	_, res = jobsCall(t, "POST", base+"/api/query", jobsToken(t, ring, "globex"), map[string]any{"type": "users:query:sent-mail", "payload": map[string]any{}})
	require.Empty(t, res["data"])

	// An api-lane job that fails is archived; the admin API lists it and
	// retries it, for admins of its tenant only.
	id, err := app.Jobs().Client().Dispatch(context.Background(), "ops-test:job:flaky", map[string]int{"n": 7}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	admin := jobsToken(t, ring, "acme", "admin")
	list := func(tok, query string) (int, map[string]any) {
		return jobsCall(t, "GET", base+"/api/admin/jobs"+query, tok, nil)
	}
	jobsEventually(t, "the archived run", func() bool {
		code, res := list(admin, "?state=archived&lane=api")
		require.Equal(t, http.StatusOK, code, res)
		return len(res["data"].(map[string]any)["items"].([]any)) == 1
	})
	_, res = list(admin, "?state=archived&lane=api")
	item := res["data"].(map[string]any)["items"].([]any)[0].(map[string]any)
	require.Equal(t, id, item["id"])
	require.Equal(t, "ops-test:job:flaky", item["job"])
	require.Equal(t, "acme", item["tenantId"])
	require.Contains(t, item["lastError"], "flaky 7 is not healthy yet")

	code, res = list(jobsToken(t, ring, "globex", "admin"), "?state=archived")
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, res["data"].(map[string]any)["items"], "another tenant's runs are invisible")
	code, res = list(acme, "")
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "access_denied", res["error"].(map[string]any)["code"])
	code, _ = list("", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, res = list(admin, "?lane=edge&state=lost&limit=0")
	require.Equal(t, http.StatusBadRequest, code)
	require.Len(t, res["error"].(map[string]any)["details"].(map[string]any)["fields"], 3)

	retry := func(tok, lane, id string) (int, map[string]any) {
		return jobsCall(t, "POST", base+"/api/admin/jobs/"+lane+"/"+id+"/retry", tok, nil)
	}
	code, _ = retry(jobsToken(t, ring, "globex", "admin"), "api", id)
	require.Equal(t, http.StatusNotFound, code, "another tenant cannot retry it")
	code, _ = retry(admin, "worker", id)
	require.Equal(t, http.StatusNotFound, code, "it is not in the worker lane")
	code, _ = retry(admin, "edge", id)
	require.Equal(t, http.StatusBadRequest, code)
	healthy.Store(true)
	// Clients escape the id in the path (encodeURIComponent: ':' and '@').
	code, res = retry(admin, "api", strings.NewReplacer(":", "%3A", "@", "%40").Replace(id))
	require.Equal(t, http.StatusOK, code, res)
	require.Equal(t, id, res["data"].(map[string]any)["id"])
	require.Equal(t, "pending", res["data"].(map[string]any)["state"])
	jobsEventually(t, "the retried run to succeed", func() bool {
		_, body, err := get(context.Background(), base+"/metrics")
		require.NoError(t, err)
		return strings.Contains(string(body), `kumiko_jobs_succeeded_total{job="ops-test:job:flaky",lane="api"} 1`)
	})
	code, res = list(admin, "?state=archived")
	require.Equal(t, http.StatusOK, code)
	require.Empty(t, res["data"].(map[string]any)["items"])

	_, body, err := get(context.Background(), base+"/metrics")
	require.NoError(t, err)
	for _, m := range []string{
		`kumiko_jobs_succeeded_total{job="orders:job:render-invoice",lane="worker"} 1`,
		`kumiko_jobs_succeeded_total{job="users:job:deliver-welcome-mail",lane="worker"} 1`,
		`kumiko_jobs_enqueued_total{job="orders:job:render-invoice",lane="worker"} 1`,
		`kumiko_jobs_archived_total{job="ops-test:job:flaky",lane="api"} 1`,
		`kumiko_jobs_event_to_start_seconds_count{job="orders:job:render-invoice",lane="worker"} 1`,
		`kumiko_jobs_queue_depth{lane="worker"}`,
	} {
		require.Contains(t, string(body), m)
	}
}
