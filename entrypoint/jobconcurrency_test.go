package entrypoint_test

import (
	"cmp"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// holdJob counts the runs of a worker-lane job that are in flight: each
// run holds until release is closed.
type holdJob struct {
	inFlight, peak, done atomic.Int64
	release              chan struct{}
	once                 sync.Once
}

// register adds the sample features and ops-test:job:hold.
func (h *holdJob) register(r *framework.Registry) {
	features.Register(r)
	jobs.Manual[struct{}](r.Feature("ops-test"), "hold", &jobs.Options{RunIn: framework.RunInWorker, MaxRetries: -1},
		func(ctx context.Context, _ *jobs.Context, _ struct{}) error {
			n := h.inFlight.Add(1)
			defer h.inFlight.Add(-1)
			for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
			}
			select {
			case <-h.release:
			case <-ctx.Done():
				return ctx.Err()
			}
			h.done.Add(1)
			return nil
		})
}

func (h *holdJob) releaseAll() { h.once.Do(func() { close(h.release) }) }

// TestJobsConcurrencyFromTheEnvironment: KUMIKO_JOBS_CONCURRENCY sizes a worker's
// lane: with more runs waiting than it admits, exactly that many run at
// once, and "job lane started" logs it; unset, a lane runs ten at once as
// before. The variable was not read at all: every lane ran ten.
func TestJobsConcurrencyFromTheEnvironment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  string // "" leaves KUMIKO_JOBS_CONCURRENCY unset
		want int
	}{{"2", 2}, {"5", 5}, {"", 10}} {
		t.Run("KUMIKO_JOBS_CONCURRENCY="+cmp.Or(tc.env, "unset"), func(t *testing.T) {
			t.Parallel()
			db := kumikotest.NewDB(t)
			rds := jobstest.StartRedis(t)
			env := map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL}
			if tc.env != "" {
				env["KUMIKO_JOBS_CONCURRENCY"] = tc.env
			}
			h := &holdJob{release: make(chan struct{})}
			var logs proctest.Buffer
			s := serve(t, entrypoint.Options{Config: newConfig(t, env), Register: h.register,
				InstanceID: "jobconc-" + cmp.Or(tc.env, "unset"), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			// Before serve's cleanup: a held run would delay the shutdown.
			t.Cleanup(h.releaseAll)
			waitServedReady(t, s)

			runs := tc.want + 3
			for range runs {
				_, err := s.app.Jobs().Client().Dispatch(context.Background(), "ops-test:job:hold", struct{}{},
					&jobs.DispatchOptions{TenantID: "acme"})
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool { return h.inFlight.Load() >= int64(tc.want) }, wait, 5*time.Millisecond,
				"%d runs should be in flight", tc.want)
			// The lane polls every 10 ms: give a run beyond the bound time
			// to start.
			time.Sleep(300 * time.Millisecond)
			require.Equal(t, int64(tc.want), h.peak.Load(), "runs in flight at once")
			h.releaseAll()
			require.Eventually(t, func() bool { return h.done.Load() == int64(runs) }, wait, 10*time.Millisecond)
			require.Equal(t, int64(tc.want), h.peak.Load(), "runs in flight at once")

			var lines []string
			for line := range strings.Lines(logs.String()) {
				if strings.Contains(line, "job lane started") {
					lines = append(lines, line)
				}
			}
			require.Len(t, lines, 1, "a worker consumes one lane")
			require.Contains(t, lines[0], "lane=worker")
			require.Contains(t, lines[0], " concurrency="+strconv.Itoa(tc.want)+" ")
			require.NoError(t, s.stop(t))
		})
	}
}

// TestServeTakesJobsConcurrency: `kumiko serve` refuses a KUMIKO_JOBS_CONCURRENCY
// outside 1..1000 at boot, naming the variable and the value, and a worker
// started with a valid one logs it on its lane.
func TestServeTakesJobsConcurrency(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"0", "-1", "abc", "1001"} {
		t.Run("refused "+v, func(t *testing.T) {
			t.Parallel()
			p := start(t, "KUMIKO_JOBS_CONCURRENCY="+v, procEnv("worker", "postgres://postgres@127.0.0.1:5432/none?sslmode=disable",
				"redis://127.0.0.1:6379/0", "jobconc-bad", "KUMIKO_JOBS_CONCURRENCY", v))
			require.Equal(t, 1, p.waitExit(t, wait))
			want := `KUMIKO_JOBS_CONCURRENCY: must be an integer between 1 and 1000, got "` + v + `"`
			if v == "abc" {
				want = `KUMIKO_JOBS_CONCURRENCY: must be a positive integer, got "abc"`
			}
			require.Contains(t, p.logs.String(), want)
		})
	}
	t.Run("worker", func(t *testing.T) {
		t.Parallel()
		db := kumikotest.NewDB(t)
		rds := jobstest.StartRedis(t)
		p := start(t, "worker", procEnv("worker", db.URL, rds.URL, "jobconc-worker", "KUMIKO_JOBS_CONCURRENCY", "3"))
		p.waitReady(t)
		require.Eventually(t, func() bool { return strings.Contains(p.logs.String(), `"msg":"job lane started"`) }, wait, 10*time.Millisecond)
		for line := range strings.Lines(p.logs.String()) {
			if strings.Contains(line, `"msg":"job lane started"`) {
				require.Contains(t, line, `"lane":"worker"`)
				require.Contains(t, line, `"concurrency":3,`)
				// MaxTransactions stays DATABASE_POOL_MAX (10) − 2.
				require.Contains(t, line, `"max_transactions":8`)
			}
		}
		p.kill()
	})
}
