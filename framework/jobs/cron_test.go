package jobs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// TestCronOneRunPerTickInProcess runs three schedulers (three runners, as
// three workers would) on one Redis: every tick runs once.
func TestCronOneRunPerTickInProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Cron(b.f, "every-second", "@every 1s", nil, func(ctx context.Context, jc *jobs.Context, tick jobs.Tick) error {
			return insertRun(ctx, jc, jc.Job, strconv.FormatInt(tick.Time.Unix(), 10), jc.TaskID)
		})
	})
	for range 3 {
		b.runner(t, &jobs.Config{Lanes: jobs.Lanes, Scheduler: true, Metrics: prometheus.NewRegistry()})
	}
	eventually(t, "four ticks", func() bool { return b.count(t, `SELECT count(DISTINCT ref) FROM runs`) >= 4 })
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM (SELECT ref FROM runs GROUP BY ref HAVING count(*) > 1) x`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM runs WHERE tenant_id <> 'system' OR info <> 'test:job:every-second@tick-' || ref`))
}

// TestCronAcrossThreeWorkerProcesses starts three real worker processes of
// the kumiko binary, whose users:job:nightly-report runs every 2 seconds:
// every process fires every tick, and each tick runs exactly once.
func TestCronAcrossThreeWorkerProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	bin := binary(t)
	var workers []*proctest.Proc
	for i := range 3 {
		env := map[string]string{}
		for _, kv := range os.Environ() {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		for k, v := range map[string]string{
			"APP_MODE": "worker", "DATABASE_URL": b.db.URL, "REDIS_URL": b.redis.URL,
			"KUMIKO_SAMPLE_CRON": "@every 2s", "WORKER_HTTP_ADDR": "127.0.0.1:0", "LOG_LEVEL": "debug",
			"KUMIKO_INSTANCE_ID": fmt.Sprintf("cron-worker-%d", i), "KUMIKO_DRAIN_TIMEOUT_MS": "10000",
		} {
			env[k] = v
		}
		workers = append(workers, proctest.Start(t, bin, fmt.Sprintf("cron-worker-%d", i), env, "serve"))
	}
	for _, w := range workers {
		eventually(t, "worker ready", func() bool {
			if !w.Alive() {
				t.Fatalf("worker exited: %v\n%s", w.Err(), w.Logs())
			}
			return strings.Contains(w.Logs(), `"msg":"process ready"`)
		})
	}
	start := time.Now()
	eventually(t, "five ticks after all workers were up", func() bool {
		return b.count(t, `SELECT count(DISTINCT tick) FROM nightly_reports WHERE tick > $1`, start) >= 5
	})
	for _, w := range workers {
		require.NoError(t, w.Signal(syscall.SIGTERM))
	}
	for _, w := range workers {
		select {
		case <-w.Exited():
			require.NoError(t, w.Err(), "worker did not exit cleanly:\n%s", w.Logs())
		case <-time.After(30 * time.Second):
			t.Fatal("worker did not stop after SIGTERM")
		}
	}

	// One run per tick, no tick missing between the first and the last.
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM (SELECT tick FROM nightly_reports GROUP BY tick HAVING count(*) > 1) x`))
	rows, err := b.db.Pool.Query(context.Background(), `SELECT DISTINCT tick FROM nightly_reports WHERE tick > $1 ORDER BY tick`, start)
	require.NoError(t, err)
	var ticks []time.Time
	for rows.Next() {
		var tk time.Time
		require.NoError(t, rows.Scan(&tk))
		ticks = append(ticks, tk)
	}
	require.NoError(t, rows.Err())
	for i := 1; i < len(ticks); i++ {
		require.Equal(t, 2*time.Second, ticks[i].Sub(ticks[i-1]), "ticks %v", ticks)
	}

	// Every worker's scheduler fired every one of those ticks; exactly one
	// enqueue per tick won.
	won := map[int64]int{}
	for i, w := range workers {
		fired := map[int64]bool{}
		sc := bufio.NewScanner(strings.NewReader(w.Logs()))
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Job  string `json:"job"`
				Tick int64  `json:"tick"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil || line.Job != "users:job:nightly-report" {
				continue
			}
			switch line.Msg {
			case "cron tick enqueued":
				won[line.Tick]++
				fired[line.Tick] = true
			case "cron tick already enqueued":
				fired[line.Tick] = true
			}
		}
		for _, tk := range ticks {
			require.True(t, fired[tk.Unix()], "worker %d did not fire tick %s", i, tk)
		}
	}
	for _, tk := range ticks {
		require.Equal(t, 1, won[tk.Unix()], "tick %s", tk)
	}
}
