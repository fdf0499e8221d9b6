package main

// Helpers shared by the event-log benchmarks (bench_append.go,
// bench_http.go, bench_dispatcher.go). Their names start with "ev" so that
// other benchmark files of this package keep theirs free.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// evDB creates a fresh migrated database and a pool of maxConns (all
// opened at once) on it; drop closes the pool and removes the database.
func evDB(ctx context.Context, maxConns int32) (*kumikotest.DB, *pgxpool.Pool, func(), error) {
	db, drop, err := kumikotest.CreateDB(ctx, nil)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create database: %w", err)
	}
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		drop()
		return nil, nil, nil, err
	}
	pc.MaxConns = maxConns
	pc.MinConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		drop()
		return nil, nil, nil, err
	}
	// Open every connection now, so that the meter sees their backends.
	conns := make([]*pgxpool.Conn, 0, maxConns)
	for range maxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return db, pool, func() { pool.Close(); drop() }, nil
}

// evSample is one measured run.
type evSample struct {
	ops     int64
	elapsed time.Duration
	// goCPU is this process's CPU time (user + system) during the run.
	goCPU time.Duration
	// pgCPU is the CPU time of the database's backends during the run
	// (0 when the server's processes are not visible).
	pgCPU time.Duration
}

func (s evSample) add(o evSample) evSample {
	return evSample{ops: s.ops + o.ops, elapsed: s.elapsed + o.elapsed, goCPU: s.goCPU + o.goCPU, pgCPU: s.pgCPU + o.pgCPU}
}

func (s evSample) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.ops) / s.elapsed.Seconds()
}

// cpuPerOp renders the CPU cost per operation.
func (s evSample) cpuPerOp() string {
	if s.ops == 0 {
		return "-"
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(s.ops) }
	return fmt.Sprintf("go %.0f µs + pg %.0f µs", per(s.goCPU), per(s.pgCPU))
}

// evMeter measures runs: wall time, operations, and the CPU time of this
// process and of the database's backends. CPU per operation is far less
// disturbed by other load on a shared machine than throughput.
type evMeter struct {
	pids []int
}

// newEvMeter finds the backends of pool's database (pools opened by evDB
// hold all their connections, so the set does not change).
func newEvMeter(ctx context.Context, pool *pgxpool.Pool) *evMeter {
	m := &evMeter{}
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	if err != nil {
		return m
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			m.pids = append(m.pids, pid)
		}
	}
	return m
}

// clockTick is the unit of /proc/<pid>/stat CPU times (USER_HZ, 100 on
// Linux).
const clockTick = 10 * time.Millisecond

// pgCPU sums the CPU time of the backends.
func (m *evMeter) pgCPU() time.Duration {
	var total time.Duration
	for _, pid := range m.pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			continue
		}
		f := strings.Fields(s[i+2:])
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+st) * clockTick
	}
	return total
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs fn, which returns its number of operations.
func (m *evMeter) measure(fn func() (int64, error)) (evSample, error) {
	pg0, go0, t0 := m.pgCPU(), processCPU(), time.Now()
	n, err := fn()
	el := time.Since(t0)
	s := evSample{ops: n, elapsed: el, goCPU: processCPU() - go0, pgCPU: m.pgCPU() - pg0}
	return s, err
}

// evRun runs op from workers goroutines for d and returns the number of
// operations. The first error stops the run and is returned, also when the
// operation failing was in flight as the time ran out.
func evRun(ctx context.Context, workers int, d time.Duration, op func(ctx context.Context, worker int) error) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		ops      atomic.Int64
		stopOnce sync.Once
		errMu    sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	stop := make(chan struct{})
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		stopOnce.Do(func() { close(stop) })
	}
	for w := range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := op(ctx, w); err != nil {
					fail(err)
					return
				}
				ops.Add(1)
			}
		})
	}
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
		stopOnce.Do(func() { close(stop) })
	case <-stop:
		timer.Stop()
	case <-ctx.Done():
		fail(ctx.Err())
	}
	wg.Wait()
	return ops.Load(), firstErr
}

// evVerifyWrites checks that the database holds exactly ops rows in table
// and ops events: every operation counted wrote one row and one event, so
// a side answering without writing cannot pass for a fast one.
func evVerifyWrites(ctx context.Context, pool *pgxpool.Pool, table string, ops int64) error {
	var rows, events int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+table+`), (SELECT count(*) FROM events)`).Scan(&rows, &events); err != nil {
		return err
	}
	if rows != ops || events != ops {
		return fmt.Errorf("%d operations counted, but %d rows in %s and %d events written", ops, rows, table, events)
	}
	return nil
}

// evSide is one contender of a comparison.
type evSide struct {
	// name labels the side in the progress output.
	name string
	// run performs one slice and returns its number of operations.
	run func() (int64, error)
}

// evCompare measures the sides in n short slices each, rotating their
// order from slice to slice, and returns each side's totals: load from
// elsewhere on the machine, and drift such as table growth, hit all sides
// alike. sides[0] is the framework; the ratios printed are against
// sides[1] (the baseline).
func evCompare(name string, m *evMeter, n int, sides ...evSide) ([]evSample, error) {
	totals := make([]evSample, len(sides))
	ratios := make([][]float64, len(sides))
	for i := range n {
		slice := make([]evSample, len(sides))
		for k := range sides {
			j := (i + k) % len(sides)
			s, err := m.measure(sides[j].run)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", name, sides[j].name, err)
			}
			slice[j] = s
			totals[j] = totals[j].add(s)
		}
		for j := range sides {
			ratios[j] = append(ratios[j], slice[j].rate()/slice[1].rate())
		}
	}
	fmt.Fprintf(os.Stderr, "   %s, %d slices per side:\n", name, n)
	for j, side := range sides {
		fmt.Fprintf(os.Stderr, "     %-44s %8.0f/s  %-28s ratio to baseline %.2f (median slice %.2f)\n",
			side.name, totals[j].rate(), totals[j].cpuPerOp()+" per op", totals[j].rate()/totals[1].rate(), median(ratios[j]))
	}
	return totals, nil
}
