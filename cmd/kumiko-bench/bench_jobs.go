package main

// Job benchmarks (framework/jobs):
//   - jobs-throughput: 20k no-op jobs enqueued and processed through the
//     framework (Client.Dispatch, a lane's runner) against raw asynq (Client.Enqueue,
//     a Server) with the same concurrency, Redis and poll interval.
//   - jobs-latency: event commit → job handler start at 200 events/s, in one
//     all-in-one-shaped process (runtime, dispatcher with the job-trigger
//     consumer, worker lane).

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

func init() {
	register(Bench{Name: "jobs-throughput", Run: benchJobsThroughput})
	register(Bench{Name: "jobs-latency", Run: benchJobsLatency})
}

const (
	jobsConcurrency   = 20
	jobsEnqueuers     = 8
	jobsCheckInterval = 10 * time.Millisecond
)

// jobsRedis returns a Redis for the job benchmarks: a private redis-server
// on a free port when one is installed (so that other work on the shared
// Redis does not disturb the comparison), else REDIS_URL (default the local
// Redis, database 0). stop shuts the private server down.
func jobsRedis() (rdb *redis.Client, stop func(), err error) {
	url := cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0")
	stop = func() {}
	if path, lerr := exec.LookPath("redis-server"); lerr == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		dir, err := os.MkdirTemp("", "kumiko-bench-redis")
		if err != nil {
			return nil, nil, err
		}
		cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		stop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
		url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		stop()
		return nil, nil, err
	}
	opts.PoolSize = 64
	rdb = redis.NewClient(opts)
	for i := 0; ; i++ {
		if err = rdb.Ping(context.Background()).Err(); err == nil {
			break
		}
		if i == 100 {
			_ = rdb.Close()
			stop()
			return nil, nil, fmt.Errorf("redis %s: %w", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "   redis: %s\n", url)
	stopServer := stop
	return rdb, func() { _ = rdb.Close(); stopServer() }, nil
}

// jobsPair measures both sides in rounds, alternating which goes first
// (ABBA), after one unmeasured run of each, and returns the medians of
// each side and of the per-round ratios: the ratio of two runs close in
// time is what load on the machine disturbs least.
func jobsPair(ctx context.Context, rounds int, baseline, framework func(ctx context.Context) (float64, error)) (fw, base, ratio float64, err error) {
	// Warm up both sides (connections, Redis scripts, code paths) outside
	// the rounds.
	if _, err = baseline(ctx); err != nil {
		return 0, 0, 0, fmt.Errorf("warm-up: %w", err)
	}
	if _, err = framework(ctx); err != nil {
		return 0, 0, 0, fmt.Errorf("warm-up: %w", err)
	}
	var fws, bases, ratios []float64
	for r := range rounds {
		var f, b float64
		if r%2 == 0 {
			if b, err = baseline(ctx); err == nil {
				f, err = framework(ctx)
			}
		} else {
			if f, err = framework(ctx); err == nil {
				b, err = baseline(ctx)
			}
		}
		if err != nil {
			return 0, 0, 0, err
		}
		fmt.Fprintf(os.Stderr, "   jobs-throughput round %d: framework %.0f, baseline %.0f (%.2f)\n", r+1, f, b, f/b)
		fws, bases, ratios = append(fws, f), append(bases, b), append(ratios, f/b)
	}
	return median(fws), median(bases), median(ratios), nil
}

// jobsPrefix is a queue prefix of its own for one measurement.
func jobsPrefix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "kumiko-bench-" + hex.EncodeToString(b)
}

// dropQueues removes every queue under prefix.
func dropQueues(rdb *redis.Client, prefix string) {
	in := asynq.NewInspectorFromRedisClient(rdb)
	for _, lane := range jobs.Lanes {
		for _, p := range []jobs.Priority{jobs.PriorityHigh, jobs.PriorityDefault, jobs.PriorityLow} {
			_ = in.DeleteQueue(jobs.QueueName(prefix, lane, p), true)
		}
	}
}

type benchNoop struct {
	N int `json:"n"`
}

// enqueueAll runs n enqueues from jobsEnqueuers goroutines.
func enqueueAll(ctx context.Context, n int, enqueue func(ctx context.Context, i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, jobsEnqueuers)
	for range jobsEnqueuers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := enqueue(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// waitCount waits until counter reaches n.
func waitCount(ctx context.Context, counter *atomic.Int64, n int64) error {
	for counter.Load() < n {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("processed %d of %d: %w", counter.Load(), n, err)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func benchJobsThroughput(ctx context.Context, env *Env) ([]Result, error) {
	n := 20000
	rounds := 5
	if env.Quick {
		n, rounds = 2000, 1
	}
	rdb, stopRedis, err := jobsRedis()
	if err != nil {
		return nil, err
	}
	defer stopRedis()
	db, drop, err := kumikotest.CreateDB(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer drop()

	raw := func(ctx context.Context) (float64, error) {
		prefix := jobsPrefix()
		defer dropQueues(rdb, prefix)
		queue := jobs.QueueName(prefix, framework.RunInWorker, jobs.PriorityDefault)
		var done atomic.Int64
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
			Concurrency: jobsConcurrency, Queues: map[string]int{queue: 1}, TaskCheckInterval: jobsCheckInterval,
			LogLevel: asynq.ErrorLevel,
		})
		mux := asynq.NewServeMux()
		mux.HandleFunc("bench:noop", func(ctx context.Context, t *asynq.Task) error {
			var p benchNoop
			if err := json.Unmarshal(t.Payload(), &p); err != nil {
				return err
			}
			done.Add(1)
			return nil
		})
		if err := srv.Start(mux); err != nil {
			return 0, err
		}
		defer srv.Shutdown()
		client := asynq.NewClientFromRedisClient(rdb)
		start := time.Now()
		err := enqueueAll(ctx, n, func(ctx context.Context, i int) error {
			b, _ := json.Marshal(benchNoop{N: i})
			_, err := client.EnqueueContext(ctx, asynq.NewTask("bench:noop", b), asynq.Queue(queue))
			return err
		})
		if err != nil {
			return 0, err
		}
		if err := waitCount(ctx, &done, int64(n)); err != nil {
			return 0, err
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}

	fw := func(ctx context.Context) (float64, error) {
		prefix := jobsPrefix()
		defer dropQueues(rdb, prefix)
		var done atomic.Int64
		reg := framework.NewRegistry()
		noop := jobs.Manual[benchNoop](reg.Feature("bench"), "noop", nil, func(context.Context, *jobs.Context, benchNoop) error {
			done.Add(1)
			return nil
		})
		rt, err := framework.NewRuntime(reg, db.Pool, nil)
		if err != nil {
			return 0, err
		}
		r, err := jobs.New(rt, rdb, &jobs.Config{
			Lanes: []framework.RunIn{framework.RunInWorker}, QueuePrefix: prefix,
			Concurrency: jobsConcurrency, TaskCheckInterval: jobsCheckInterval,
		})
		if err != nil {
			return 0, err
		}
		runCtx, stop := context.WithCancel(ctx)
		runDone := make(chan error, 1)
		go func() { runDone <- r.Run(runCtx) }()
		defer func() { stop(); <-runDone }()
		client := r.Client()
		start := time.Now()
		err = enqueueAll(ctx, n, func(ctx context.Context, i int) error {
			_, err := noop.Dispatch(ctx, client, benchNoop{N: i}, nil)
			return err
		})
		if err != nil {
			return 0, err
		}
		if err := waitCount(ctx, &done, int64(n)); err != nil {
			return 0, err
		}
		return float64(n) / time.Since(start).Seconds(), nil
	}

	f, b, ratio, err := jobsPair(ctx, rounds, raw, fw)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "   median of the per-round ratios: %.2f (medians %.0f vs %.0f jobs/s)\n", ratio, f, b)
	// Value is the baseline's median scaled by the median per-round ratio,
	// so that the table's ratio column shows that ratio.
	return []Result{{
		Name:  fmt.Sprintf("jobs: %d no-op jobs enqueued+processed, concurrency %d", n, jobsConcurrency),
		Value: b * ratio, Unit: "jobs/s", Baseline: "raw asynq", BaselineValue: b,
		Target: ">= 0.80", Pass: ratio >= 0.80,
	}}, nil
}

type benchEvent struct {
	N int `json:"n"`
}

func benchJobsLatency(ctx context.Context, env *Env) ([]Result, error) {
	const rate = 200
	dur, warm := 20*time.Second, 2*time.Second
	if env.Quick {
		dur, warm = 4*time.Second, time.Second
	}
	rdb, stopRedis, err := jobsRedis()
	if err != nil {
		return nil, err
	}
	defer stopRedis()
	db, drop, err := kumikotest.CreateDB(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer drop()
	prefix := jobsPrefix()
	defer dropQueues(rdb, prefix)

	total := int(dur.Seconds() * rate)
	committed := make([]atomic.Int64, total) // unix nanos when the write returned
	started := make([]atomic.Int64, total)   // unix nanos when the job began
	var ran atomic.Int64                     // events whose job started

	reg := framework.NewRegistry()
	f := reg.Feature("bench")
	ev := framework.DefineEvent[benchEvent](f, "happened", nil)
	jobs.OnEvent(f, "react", ev, nil, func(_ context.Context, _ *jobs.Context, e framework.Event[benchEvent]) error {
		now := time.Now().UnixNano()
		// ran counts events whose job started, each once: a job run twice
		// must not stand in for one that never ran.
		if n := e.Payload.N; n >= 0 && n < total && started[n].CompareAndSwap(0, now) {
			ran.Add(1)
		}
		return nil
	})
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	if err != nil {
		return nil, err
	}
	r, err := jobs.New(rt, rdb, &jobs.Config{Lanes: []framework.RunIn{framework.RunInWorker}, QueuePrefix: prefix})
	if err != nil {
		return nil, err
	}
	d, err := dispatcher.New(db.Pool, reg, []dispatcher.Consumer{r.Consumer()}, &dispatcher.Config{InstanceID: "bench-jobs"})
	if err != nil {
		return nil, err
	}
	rt.OnCommit(func(int) { d.Wake() })
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = r.Run(runCtx) })
	wg.Go(func() { _ = d.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()
	time.Sleep(500 * time.Millisecond) // lanes and consumer up

	interval := time.Second / rate
	next := time.Now()
	for i := range total {
		next = next.Add(interval)
		time.Sleep(time.Until(next))
		_, err := rt.InTx(ctx, "bench", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "thing", ID: fmt.Sprint(i % 64)}, framework.AnyVersion, ev.With(benchEvent{N: i}))
		})
		if err != nil {
			return nil, err
		}
		committed[i].Store(time.Now().UnixNano())
	}
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := waitCount(waitCtx, &ran, int64(total)); err != nil {
		return nil, err
	}
	skip := int(warm.Seconds() * rate)
	lat := make([]time.Duration, 0, total-skip)
	for i := skip; i < total; i++ {
		s, c := started[i].Load(), committed[i].Load()
		if s == 0 {
			return nil, fmt.Errorf("event %d: its job never started", i)
		}
		lat = append(lat, max(time.Duration(s-c), 0))
	}
	p50, p99 := quantile(lat, 0.50), quantile(lat, 0.99)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	name := fmt.Sprintf("jobs: event commit → job start at %d events/s (%d events)", rate, len(lat))
	return []Result{
		{Name: name + " p50", Value: ms(p50), Unit: "ms", Target: "<= 25 ms", Pass: p50 <= 25*time.Millisecond},
		{Name: name + " p99", Value: ms(p99), Unit: "ms", Target: "<= 100 ms", Pass: p99 <= 100*time.Millisecond},
	}, nil
}
