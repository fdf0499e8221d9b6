package jobs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
//
// A worker logs "process ready" before its scheduler runs (that starts
// once the migrations are checked and the lanes are up), and a scheduler
// fires only the ticks after its start; a tick that passed meanwhile is
// fired by the others. So the ticks every worker must fire are those after
// each worker fired one: before, a worker that a loaded host held back
// between the two missed the first tick after "process ready" and failed
// the test. For the same reason the test waits for every worker to log
// those ticks before it stops them (a stopping worker may miss a tick it
// was late for); a tick that runs while they stop is checked for running
// once only.
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
	var from int64 // the latest of the workers' first fired ticks
	eventually(t, "every worker's scheduler firing", func() bool {
		from = 0
		for _, w := range workers {
			if !w.Alive() {
				t.Fatalf("worker exited: %v\n%s", w.Err(), w.Logs())
			}
			fired, _ := cronLog(t, w)
			if len(fired) == 0 {
				return false
			}
			from = max(from, slices.Min(slices.Collect(maps.Keys(fired))))
		}
		return true
	})
	ticksAfter := func() []int64 {
		rows, err := b.db.Pool.Query(context.Background(),
			`SELECT DISTINCT extract(epoch FROM tick)::bigint FROM nightly_reports WHERE tick > $1 ORDER BY 1`, time.Unix(from, 0))
		require.NoError(t, err)
		ticks, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		return ticks
	}
	// Five ticks after that, each run and fired by every worker: a worker
	// whose scheduler skips a tick, or stops, never gets there.
	var missing string
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing = ""
		ticks := ticksAfter()
		if len(ticks) < 5 {
			missing = fmt.Sprintf("ticks after %d: %v", from, ticks)
		}
		for i, w := range workers {
			fired, _ := cronLog(t, w)
			for _, tk := range ticks[:min(len(ticks), 5)] {
				if !fired[tk] {
					missing += fmt.Sprintf("; worker %d did not fire tick %d", i, tk)
				}
			}
		}
		if missing == "" {
			break
		}
		require.True(t, time.Now().Before(deadline), "timed out: %s", strings.TrimPrefix(missing, "; "))
		time.Sleep(20 * time.Millisecond)
	}
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

	// One run per tick, no tick missing between the first and the last
	// (also those that ran while the workers stopped).
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM (SELECT tick FROM nightly_reports GROUP BY tick HAVING count(*) > 1) x`))
	ticks := ticksAfter()
	for i := 1; i < len(ticks); i++ {
		require.Equal(t, int64(2), ticks[i]-ticks[i-1], "ticks %v", ticks)
	}
	// Exactly one enqueue per tick won.
	won := map[int64]int{}
	for _, w := range workers {
		_, enqueued := cronLog(t, w)
		for tk, n := range enqueued {
			won[tk] += n
		}
	}
	for _, tk := range ticks {
		require.Equal(t, 1, won[tk], "tick %d", tk)
	}
}

// cronLog reads the ticks of users:job:nightly-report a worker's scheduler
// logged: those it fired, and how often it won a tick's enqueue.
func cronLog(t *testing.T, w *proctest.Proc) (fired map[int64]bool, enqueued map[int64]int) {
	t.Helper()
	fired, enqueued = map[int64]bool{}, map[int64]int{}
	sc := bufio.NewScanner(strings.NewReader(w.Logs()))
	sc.Buffer(nil, 1<<20)
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
			enqueued[line.Tick]++
			fired[line.Tick] = true
		case "cron tick already enqueued":
			fired[line.Tick] = true
		}
	}
	require.NoError(t, sc.Err())
	return fired, enqueued
}
