package entrypoint_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/cache"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// expectedConsumers applies the table of ARCHITECTURE.md §7 to the sample
// features, independently of the entrypoint's own code: the state rows
// (name/instance) a process of mode must hold.
func expectedConsumers(t *testing.T, mode, instance string) []string {
	t.Helper()
	reg := framework.NewRegistry()
	features.Register(reg)
	require.NoError(t, reg.Build())
	var out []string
	for _, p := range reg.Projections() {
		if p.Kind() != framework.KindMultiStream {
			continue
		}
		o := p.Options()
		inst := dispatcher.SharedInstance
		if o.Delivery == framework.DeliveryPerInstance {
			inst = instance
		}
		var runs bool
		switch mode {
		case "api":
			runs = o.Delivery == framework.DeliveryPerInstance
		case "worker":
			runs = o.Delivery == framework.DeliveryShared && (o.RunIn == framework.RunInWorker || o.RunIn == framework.RunInBoth)
		default:
			runs = true
		}
		if runs {
			out = append(out, p.Name()+"/"+inst)
		}
	}
	if mode != "api" && jobs.For(reg).Len() > 0 {
		out = append(out, jobs.ConsumerName+"/"+dispatcher.SharedInstance) // the job trigger
	}
	if mode != "api" && reg.HasCachedQueries() {
		out = append(out, cache.ConsumerName+"/"+dispatcher.SharedInstance) // shared, like a worker projection
	}
	if mode != "worker" {
		out = append(out, sse.ConsumerName+"/"+instance) // per-instance SSE
	}
	slices.Sort(out)
	return out
}

// expectedLanes returns the job lanes (queue names) a process of mode
// consumes: the lanes the mode runs that have jobs.
func expectedLanes(t *testing.T, mode string, runLocal bool) []string {
	t.Helper()
	reg := framework.NewRegistry()
	features.Register(reg)
	require.NoError(t, reg.Build())
	var lanes []framework.RunIn
	switch mode {
	case "api":
		if runLocal {
			lanes = []framework.RunIn{framework.RunInAPI}
		}
	case "worker":
		lanes = []framework.RunIn{framework.RunInWorker}
	default:
		lanes = []framework.RunIn{framework.RunInAPI, framework.RunInWorker}
	}
	var out []string
	for _, l := range lanes {
		if len(jobs.For(reg).InLane(l)) > 0 {
			out = append(out, jobs.QueueName("", l, jobs.PriorityDefault))
		}
	}
	return out
}

// stateRows lists the consumer state rows of a database.
func stateRows(t *testing.T, db *kumikotest.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT name || '/' || instance_id FROM event_consumers ORDER BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		out = append(out, s)
	}
	require.NoError(t, rows.Err())
	return out
}

// laneQueues returns the asynq queues the process with pid consumes
// (their lanes' names without the priority suffix), waiting up to a few
// seconds for its servers to register.
func laneQueues(t *testing.T, redisURL string, pid int, want int) []string {
	t.Helper()
	opt, err := asynq.ParseRedisURI(redisURL)
	require.NoError(t, err)
	in := asynq.NewInspector(opt)
	defer in.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		servers, err := in.Servers()
		require.NoError(t, err)
		set := map[string]bool{}
		for _, s := range servers {
			if s.PID != pid {
				continue
			}
			for q := range s.Queues {
				q = strings.TrimSuffix(strings.TrimSuffix(q, "-high"), "-low")
				set[q] = true
			}
		}
		var out []string
		for q := range set {
			out = append(out, q)
		}
		slices.Sort(out)
		if len(out) >= want || time.Now().After(deadline) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestModes boots every mode as a real process and checks that it runs
// exactly what the table says: the consumers holding state rows, the job
// lanes with asynq servers, and the HTTP surface.
func TestModes(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		mode     string
		extra    []string
		runLocal bool
		httpAPI  bool
	}{
		{name: "all-in-one", mode: "all-in-one", httpAPI: true},
		{name: "api", mode: "api", httpAPI: true},
		{name: "api with RunLocalJobs", mode: "api", extra: []string{"KUMIKO_RUN_LOCAL_JOBS", "true"}, runLocal: true, httpAPI: true},
		{name: "worker", mode: "worker"},
		{name: "default is all-in-one", mode: "", httpAPI: true},
	}
	// The sample features have worker-lane jobs: the worker and all-in-one
	// processes must run that lane, the api process none.
	require.Equal(t, []string{"kumiko-jobs-worker"}, expectedLanes(t, "worker", false))
	require.Empty(t, expectedLanes(t, "api", false))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := kumikotest.NewDB(t)
			rds := jobstest.StartRedis(t)
			inst := "modes-" + strings.ReplaceAll(tc.name, " ", "-")
			p := start(t, tc.name, procEnv(tc.mode, db.URL, rds.URL, inst, tc.extra...))
			p.waitReady(t)

			mode := tc.mode
			if mode == "" {
				mode = "all-in-one"
			}
			require.Equal(t, expectedConsumers(t, mode, inst), stateRows(t, db))
			lanes := expectedLanes(t, mode, tc.runLocal)
			if len(lanes) == 0 {
				// Give a wrongly started lane time to register.
				time.Sleep(time.Second)
			}
			require.Equal(t, lanes, laneQueues(t, rds.URL, p.cmd.Process.Pid, len(lanes)))

			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			code, body, err := get(ctx, p.url+"/health/live")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, string(body), `"status":"ok"`)
			code, body, err = get(ctx, p.url+"/health/ready")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code, string(body))
			require.Contains(t, string(body), `"state":"ready"`)
			// "consumers": readiness waits for the dispatcher's state rows,
			// which the check above relies on.
			for _, check := range []string{"database", "redis", "migrations", "consumers"} {
				require.Contains(t, string(body), `"name":"`+check+`","ok":true`)
			}

			code, _, err = get(ctx, p.url+sse.Path)
			require.NoError(t, err)
			if tc.httpAPI {
				require.Equal(t, http.StatusUnauthorized, code, "the API and its stream are served")
				p.place(t, "acme", "alice")
			} else {
				require.Equal(t, http.StatusNotFound, code, "a worker serves only health and metrics")
			}
			code, body, err = get(ctx, p.url+"/metrics")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, code)
			metrics := string(body)
			// Uptime monitors and load balancers often probe with HEAD.
			for _, path := range []string{"/health/live", "/health/ready", "/metrics"} {
				req, err := http.NewRequestWithContext(ctx, http.MethodHead, p.url+path, nil)
				require.NoError(t, err)
				resp, err := httpClient.Do(req)
				require.NoError(t, err)
				resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode, "HEAD %s", path)
			}
			has := func(line string) {
				t.Helper()
				require.True(t, strings.Contains(metrics, line), "/metrics lacks %s", line)
			}
			for _, m := range []string{"go_goroutines ", "process_resident_memory_bytes ", "kumiko_event_visibility_lag_seconds ",
				"kumiko_dispatcher_listen_connected "} {
				has(m)
			}
			// Every consumer of the process has its series, labelled by
			// consumer and instance_id, before anything failed.
			for _, c := range expectedConsumers(t, mode, inst) {
				name, instance, _ := strings.Cut(c, "/")
				has(fmt.Sprintf("kumiko_event_consumer_events_failed_total{consumer=%q,instance_id=%q} 0\n", name, instance))
				has(fmt.Sprintf("kumiko_event_consumer_events_processed_total{consumer=%q,instance_id=%q} ", name, instance))
			}
			// The cache's failure counters too, for each cached query (a
			// worker's jobs may run cached queries).
			for _, m := range []string{"kumiko_cache_redis_errors_total", "kumiko_cache_bypassed_total"} {
				has(m + `{query="orders:query:get"} 0` + "\n")
			}
			if tc.httpAPI {
				has(`kumiko_http_requests_total{code="200",method="POST",route="/api/write"} 1`)
				has(`kumiko_http_requests_total{code="401",method="GET",route="/api/sse"} 1`)
				has(`kumiko_http_request_duration_seconds_count{method="POST",route="/api/write"} 1`)
				has("kumiko_sse_clients 0")
				has("kumiko_sse_dropped_clients_total 0")
			}
		})
	}
}

// TestBadAppMode: an unknown APP_MODE fails at boot, naming the allowed
// values.
func TestBadAppMode(t *testing.T) {
	t.Parallel()
	p := start(t, "bad mode", procEnv("server", "postgres://postgres@127.0.0.1:5432/none?sslmode=disable", "redis://127.0.0.1:6379/0", "bad"))
	require.Equal(t, 1, p.waitExit(t, wait))
	logs := p.logs.String()
	require.Contains(t, logs, "APP_MODE")
	require.Contains(t, logs, `must be one of api, worker, all-in-one, got "server"`)
}
