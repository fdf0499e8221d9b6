package jobs_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial to stderr; the outage tests cause
	// thousands on purpose.
	redis.SetLogger(quietRedis{})
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

type noted struct {
	N int `json:"n"`
}

// bundle is a test's database, registry, runtime and private Redis.
type bundle struct {
	db    *kumikotest.DB
	reg   *framework.Registry
	f     *framework.Feature
	noted framework.EventType[noted]
	rt    *framework.Runtime
	redis *jobstest.Redis
	rdb   *redis.Client
	prom  *prometheus.Registry
}

// setup creates the bundle; register adds the test's jobs before the
// registry is built.
func setup(t *testing.T, register func(b *bundle)) *bundle {
	t.Helper()
	b := &bundle{db: kumikotest.NewDB(t), reg: framework.NewRegistry(), prom: prometheus.NewRegistry()}
	b.f = b.reg.Feature("test")
	b.noted = framework.DefineEvent[noted](b.f, "noted", nil)
	_, err := b.db.Pool.Exec(context.Background(), `
		CREATE TABLE runs (tenant_id text NOT NULL, job text NOT NULL, ref text NOT NULL, info text, at timestamptz NOT NULL DEFAULT now());
		SELECT kumiko_enable_tenancy('runs');
		CREATE TABLE effects (tenant_id text NOT NULL, key text NOT NULL);
		SELECT kumiko_enable_tenancy('effects');`)
	require.NoError(t, err)
	if register != nil {
		register(b)
	}
	b.rt, err = framework.NewRuntime(b.reg, b.db.Pool, nil)
	require.NoError(t, err)
	b.redis = jobstest.StartRedis(t)
	b.rdb = b.redis.Client(t)
	return b
}

// runner builds a runner on the bundle's Redis and runs it until the test
// ends (nil cfg: both lanes, fast polling).
func (b *bundle) runner(t *testing.T, cfg *jobs.Config) *jobs.Runner {
	t.Helper()
	if cfg == nil {
		cfg = &jobs.Config{Lanes: jobs.Lanes}
	}
	cfg.RetryCheckInterval = max(cfg.RetryCheckInterval, 100*time.Millisecond)
	cfg.ShutdownTimeout = max(cfg.ShutdownTimeout, 2*time.Second)
	if cfg.Metrics == nil {
		cfg.Metrics = b.prom
	}
	if os.Getenv("JOBS_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, err := jobs.New(b.rt, b.rdb, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// dispatch runs a dispatcher with the given consumers until the test ends,
// woken by the runtime's commits.
func (b *bundle) dispatch(t *testing.T, consumers ...dispatcher.Consumer) *dispatcher.Dispatcher {
	t.Helper()
	d, err := dispatcher.New(b.db.Pool, b.reg, consumers, &dispatcher.Config{
		InstanceID: "test-instance", PollInterval: 20 * time.Millisecond, Logger: testLogger(),
		RetryBaseDelay: 50 * time.Millisecond, RetryMaxDelay: 400 * time.Millisecond,
	})
	require.NoError(t, err)
	b.rt.OnCommit(func(int) { d.Wake() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// write appends n noted events (n0..) for tenant, one transaction each.
func (b *bundle) write(t *testing.T, tenant string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		_, err := b.rt.InTx(context.Background(), tenant, framework.Metadata{CorrelationID: fmt.Sprintf("corr-%d", i)}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: fmt.Sprint(i)}, framework.AnyVersion, b.noted.With(noted{N: i}))
		})
		require.NoError(t, err)
	}
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// eventually polls cond until it holds or 30 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// drained waits until the lanes' queues hold no pending, active, scheduled
// or retry run: every enqueued run has finished (or is archived).
func drained(t *testing.T, in *jobs.Inspector) {
	t.Helper()
	empty := func() bool {
		for _, st := range []jobs.State{jobs.StatePending, jobs.StateActive, jobs.StateScheduled, jobs.StateRetry} {
			items, err := in.List(context.Background(), &jobs.ListOptions{State: st, Limit: 1})
			if err != nil || len(items) > 0 {
				return false
			}
		}
		return true
	}
	// The states are read one after another: a child enqueued after the
	// pending list was read, by a parent that finished before the active
	// list was, is in none of them. Such a child is seen by a second look
	// (or has finished by then), so the queues count as drained only when
	// two looks in a row find them empty.
	eventually(t, "queues drained", func() bool {
		for range 2 {
			if !empty() {
				return false
			}
		}
		return true
	})
}

// insertRun records one run in the runs table inside the job's transaction.
func insertRun(ctx context.Context, jc *jobs.Context, job, ref, info string) error {
	return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO runs (tenant_id, job, ref, info) VALUES ($1, $2, $3, $4)`, tx.TenantID(), job, ref, info)
		return err
	})
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// binary builds the kumiko binary once per test process.
func binary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			binErr = err
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		dir, err := os.MkdirTemp("", "kumiko-jobs-test")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "kumiko")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/kumiko")
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			binErr = fmt.Errorf("go build: %w: %s", err, stderr.String())
		}
	})
	require.NoError(t, binErr)
	return binPath
}

// kumiko runs the binary with env and returns its output.
func kumiko(t *testing.T, env []string, args ...string) string {
	t.Helper()
	// Built first: under load the build alone can take a good part of a
	// minute, which must not count against the command's bound.
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "kumiko %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// metric sums the samples of a metric family whose labels match the pairs
// (histograms count observations).
func metric(t *testing.T, b *bundle, name string, labelPairs ...string) float64 {
	t.Helper()
	fams, err := b.prom.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labelPairs); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labelPairs[i] && lp.GetValue() == labelPairs[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// testLogger logs to stderr when JOBS_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("JOBS_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
