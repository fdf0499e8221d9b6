package jobs_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
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

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestCronAcrossThreeWorkerProcesses starts three real worker processes of
// the kumiko binary, whose users:job:nightly-report runs every 2 seconds:
// every process fires every tick, and each tick runs exactly once.
func TestCronAcrossThreeWorkerProcesses(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	bin := binary(t)
	type worker struct {
		cmd  *exec.Cmd
		logs *lockedBuffer
		done chan error
	}
	var workers []*worker
	for i := range 3 {
		w := &worker{logs: &lockedBuffer{}, done: make(chan error, 1)}
		w.cmd = exec.Command(bin, "serve")
		w.cmd.Env = append(os.Environ(),
			"APP_MODE=worker", "DATABASE_URL="+b.db.URL, "REDIS_URL="+b.redis.URL,
			"KUMIKO_SAMPLE_CRON=@every 2s", "WORKER_HTTP_ADDR=127.0.0.1:0", "LOG_LEVEL=debug",
			fmt.Sprintf("KUMIKO_INSTANCE_ID=cron-worker-%d", i), "KUMIKO_DRAIN_TIMEOUT_MS=10000")
		w.cmd.Stdout, w.cmd.Stderr = w.logs, w.logs
		require.NoError(t, w.cmd.Start())
		go func() { w.done <- w.cmd.Wait() }()
		workers = append(workers, w)
		t.Cleanup(func() {
			_ = w.cmd.Process.Kill()
			<-w.done
		})
	}
	for _, w := range workers {
		eventually(t, "worker ready", func() bool {
			select {
			case err := <-w.done:
				t.Fatalf("worker exited: %v\n%s", err, w.logs.String())
			default:
			}
			return strings.Contains(w.logs.String(), `"msg":"process ready"`)
		})
	}
	start := time.Now()
	eventually(t, "five ticks after all workers were up", func() bool {
		return b.count(t, `SELECT count(DISTINCT tick) FROM nightly_reports WHERE tick > $1`, start) >= 5
	})
	for _, w := range workers {
		require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	}
	for _, w := range workers {
		select {
		case err := <-w.done:
			require.NoError(t, err, "worker did not exit cleanly:\n%s", w.logs.String())
		case <-time.After(30 * time.Second):
			t.Fatal("worker did not stop after SIGTERM")
		}
		w.done <- nil // for the cleanup
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
		sc := bufio.NewScanner(strings.NewReader(w.logs.String()))
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
