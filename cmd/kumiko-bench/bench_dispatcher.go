package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/internal/rawpass"
)

func init() {
	register(Bench{Name: "dispatcher-catchup", Run: benchCatchUp})
	register(Bench{Name: "dispatcher-latency", Run: benchLatency})
}

// tick is the payload of the dispatcher benchmarks' event.
type tick struct {
	N        int64  `json:"n"`
	Customer string `json:"customer"`
}

// backlogThenRegister appends n events of typ as a backlog, then registers
// d's consumers, which start at the log's beginning.
func backlogThenRegister(ctx context.Context, pool *pgxpool.Pool, d *dispatcher.Dispatcher, typ string, n int) error {
	fmt.Fprintf(os.Stderr, "   filling a backlog of %d events\n", n)
	if err := fillBacklog(ctx, pool, typ, n); err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	return d.Register(ctx)
}

// fillBacklog appends n events of type typ in big multi-row appends
// (1000 events per statement, spread over streams and four tenants), as
// the system tenant, outside any measurement.
func fillBacklog(ctx context.Context, pool *pgxpool.Pool, typ string, n int) error {
	const perAppend = 1000
	for start := 0; start < n; start += perAppend * 10 {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		for a := start; a < min(start+perAppend*10, n); a += perAppend {
			evs := make([]eventstore.NewEvent, 0, perAppend)
			for i := a; i < min(a+perAppend, n); i++ {
				p, err := json.Marshal(tick{N: int64(i), Customer: "c" + strconv.Itoa(i%1000)})
				if err != nil {
					return err
				}
				evs = append(evs, eventstore.NewEvent{Type: typ, TypeVersion: 1, Payload: p,
					Metadata: eventstore.Metadata{CorrelationID: "backlog", UserID: "bench"}})
			}
			stream := eventstore.StreamRef{TenantID: "tenant-" + strconv.Itoa((a/perAppend)%4), Type: "ticker", ID: strconv.Itoa(a / perAppend)}
			if _, err := eventstore.Append(ctx, tx, stream, eventstore.AnyVersion, evs); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	_, err := pool.Exec(ctx, `VACUUM ANALYZE events`)
	return err
}

// rawCatchUp puts its own state row at the start of the log and runs raw
// passes (internal/rawpass: the same lock / read below the horizon /
// checkpoint transaction a pass runs, written against pgx directly) of
// batch events until n events were read; it returns their number.
func rawCatchUp(ctx context.Context, pool *pgxpool.Pool, name string, batch, n int) (int64, error) {
	if _, err := pool.Exec(ctx, rawpass.RegisterSQL, name); err != nil {
		return 0, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	got := 0
	for got < n {
		k, err := rawpass.Pass(ctx, conn.Conn(), name, batch)
		if err != nil {
			return 0, err
		}
		if k == 0 {
			return 0, fmt.Errorf("raw loop stalled after %d events", got)
		}
		got += k
	}
	return int64(got), nil
}

// dispatcherCatchUp rewinds the consumer and runs RunOnce until n events
// were delivered; it returns their number.
func dispatcherCatchUp(ctx context.Context, pool *pgxpool.Pool, d *dispatcher.Dispatcher, name string, n int) (int64, error) {
	if _, err := pool.Exec(ctx, rawpass.RewindSQL, name); err != nil {
		return 0, err
	}
	got := 0
	for got < n {
		k, err := d.RunOnce(ctx, name)
		if err != nil {
			return 0, err
		}
		if k == 0 {
			return 0, fmt.Errorf("dispatcher stalled after %d events", got)
		}
		got += k
	}
	return int64(got), nil
}

// benchUpsertSQL is the projection's statement: one row per customer.
const benchUpsertSQL = `INSERT INTO bench_totals AS t (tenant_id, customer, events, last_n) VALUES ($1, $2, 1, $3)
ON CONFLICT (tenant_id, customer) DO UPDATE SET events = t.events + 1, last_n = EXCLUDED.last_n`

// benchCatchUp: catch-up of a 200k-event backlog by a no-op consumer
// against the raw loop, and by a projection upserting one row per event.
func benchCatchUp(ctx context.Context, env *Env) ([]Result, error) {
	n, rounds := 200_000, 6
	if env.Quick {
		n, rounds = 20_000, 2
	}
	const batch = 500
	_, pool, drop, err := evDB(ctx, 4)
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := pool.Exec(ctx, `CREATE TABLE bench_totals (tenant_id text NOT NULL, customer text NOT NULL,
  events bigint NOT NULL, last_n bigint NOT NULL, PRIMARY KEY (tenant_id, customer));
SELECT kumiko_enable_tenancy('bench_totals')`); err != nil {
		return nil, err
	}
	reg := framework.NewRegistry()
	f := reg.Feature("bench")
	ticked := framework.DefineEvent[tick](f, "ticked", nil)
	proj := framework.MultiStreamProjection(f, "totals", &framework.ProjectionOptions{Table: "bench_totals", BatchSize: batch})
	// tx.Queue: the upserts of a pass travel in one pipeline with its
	// COMMIT (as features/orders' order-totals does).
	framework.On(proj, ticked, func(ctx context.Context, tx *framework.Tx, e framework.Event[tick]) error {
		return tx.Queue(ctx, benchUpsertSQL, e.TenantID, e.Payload.Customer, e.Payload.N)
	})
	if err := reg.Build(); err != nil {
		return nil, err
	}
	noop := dispatcher.Consumer{Name: "bench:noop", BatchSize: batch,
		Apply: func(context.Context, *framework.Tx, framework.Envelope) error { return nil }}
	consumers := append([]dispatcher.Consumer{noop}, dispatcher.ProjectionConsumers(reg, nil)...)
	d, err := dispatcher.New(pool, reg, consumers, &dispatcher.Config{InstanceID: "bench", BatchSize: batch})
	if err != nil {
		return nil, err
	}
	if err := backlogThenRegister(ctx, pool, d, ticked.Name(), n); err != nil {
		return nil, err
	}
	// Warm up both (caches, plans) on the first part of the log.
	if _, err := rawCatchUp(ctx, pool, "bench:raw", batch, min(n, 20_000)); err != nil {
		return nil, err
	}
	if _, err := dispatcherCatchUp(ctx, pool, d, noop.Name, min(n, 20_000)); err != nil {
		return nil, err
	}
	m := newEvMeter(ctx, pool)
	totals, err := evCompare(fmt.Sprintf("catch-up of %dk events", n/1000), m, rounds,
		evSide{name: "dispatcher RunOnce, no-op consumer", run: func() (int64, error) { return dispatcherCatchUp(ctx, pool, d, noop.Name, n) }},
		evSide{name: "baseline: raw pgx lock/read/checkpoint loop", run: func() (int64, error) { return rawCatchUp(ctx, pool, "bench:raw", batch, n) }})
	if err != nil {
		return nil, err
	}
	fwS, baseS := totals[0], totals[1]
	catchUp := Result{
		Name:          fmt.Sprintf("catch-up %dk events, no-op consumer, batch %d", n/1000, batch),
		Value:         fwS.rate(),
		Unit:          "events/s",
		Baseline:      "raw pgx lock/read/checkpoint loop",
		BaselineValue: baseS.rate(),
		Target:        ">= 0.80 and >= 100k events/s",
	}
	catchUp.Pass = catchUp.Ratio() >= 0.80 && fwS.rate() >= 100_000

	// The upserting projection, on the same backlog; for reference, raw
	// pgx doing the same upserts one statement per event in transactions
	// of 500 (its ceiling with one round trip per event).
	projS, err := m.measure(func() (int64, error) { return dispatcherCatchUp(ctx, pool, d, proj.Name(), n) })
	if err != nil {
		return nil, err
	}
	var total int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(events), 0) FROM bench_totals`).Scan(&total); err != nil {
		return nil, err
	}
	if total != int64(n) {
		return nil, fmt.Errorf("projection counted %d of %d events", total, n)
	}
	rawS, err := m.measure(func() (int64, error) { return rawUpserts(ctx, pool, batch, n) })
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "   upsert projection: %.0f/s (%s per event); raw per-event upserts %.0f/s (%s per event)\n",
		projS.rate(), projS.cpuPerOp(), rawS.rate(), rawS.cpuPerOp())
	upsert := Result{
		Name:          fmt.Sprintf("catch-up %dk events, projection upserting 1 row/event", n/1000),
		Value:         projS.rate(),
		Unit:          "events/s",
		Baseline:      "raw pgx, 1 upsert round trip/event",
		BaselineValue: rawS.rate(),
		Target:        ">= 20000 events/s",
		Pass:          projS.rate() >= 20_000,
	}
	return []Result{catchUp, upsert}, nil
}

// rawUpserts runs the projection's upsert n times, one Exec per event,
// committing every batch events, as the system tenant.
func rawUpserts(ctx context.Context, pool *pgxpool.Pool, batch, n int) (int64, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	for done := 0; done < n; {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return 0, err
		}
		for i := done; i < min(done+batch, n); i++ {
			if _, err := tx.Exec(ctx, benchUpsertSQL, "tenant-"+strconv.Itoa(i/1000%4), "raw-c"+strconv.Itoa(i%1000), int64(i)); err != nil {
				_ = tx.Rollback(ctx)
				return 0, err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		done = min(done+batch, n)
	}
	return int64(n), nil
}

// benchLatency: commit → handler latency at a steady 500 events/s. The
// writer commits through Runtime.InTx; its OnCommit wakes a dispatcher.
// "in-process" wires the consumer's own dispatcher (all-in-one); "via
// LISTEN" wakes a second dispatcher without consumers whose coalesced
// NOTIFY reaches the consumer's dispatcher through its LISTEN connection
// (an API process and a worker).
func benchLatency(ctx context.Context, env *Env) ([]Result, error) {
	dur := 10 * time.Second
	if env.Quick {
		dur = 2 * time.Second
	}
	const rate = 500
	var out []Result
	for _, viaListen := range []bool{false, true} {
		lat, held, err := measureLatency(ctx, rate, dur, viaListen)
		if err != nil {
			return nil, err
		}
		p50, p99 := quantile(lat, 0.50), quantile(lat, 0.99)
		how := "in-process wake"
		if viaListen {
			how = "wake via NOTIFY/LISTEN"
		}
		fmt.Fprintf(os.Stderr, "   latency %s: %d events, p50 %s, p99 %s, max %s; transactions of other databases held the visibility horizon for up to %s\n",
			how, len(lat), p50, p99, quantile(lat, 1), held.Round(time.Millisecond))
		out = append(out,
			Result{Name: "commit→handler p50 at 500 events/s, " + how, Value: float64(p50.Microseconds()) / 1000, Unit: "ms",
				Target: "<= 5 ms", Pass: p50 <= 5*time.Millisecond},
			Result{Name: "commit→handler p99 at 500 events/s, " + how, Value: float64(p99.Microseconds()) / 1000, Unit: "ms",
				Target: "<= 30 ms", Pass: p99 <= 30*time.Millisecond})
	}
	return out, nil
}

// measureLatency writes rate events/s for dur and returns each event's
// delay from its commit (InTx's OnCommit) to its handler, and the longest
// time a transaction of another database on the server held the
// visibility horizon back meanwhile (the horizon is cluster-wide: such a
// transaction delays delivery everywhere, see ARCHITECTURE §2).
func measureLatency(ctx context.Context, rate int, dur time.Duration, viaListen bool) (lat []time.Duration, held time.Duration, err error) {
	_, pool, drop, err := evDB(ctx, 8)
	if err != nil {
		return nil, 0, err
	}
	defer drop()
	heldCtx, stopHeld := context.WithCancel(ctx)
	heldDone := make(chan time.Duration)
	go func() { heldDone <- foreignHorizonHold(heldCtx, pool) }()
	defer func() {
		stopHeld()
		held = <-heldDone
	}()
	reg := framework.NewRegistry()
	f := reg.Feature("bench")
	ticked := framework.DefineEvent[tick](f, "ticked", nil)
	var (
		mu        sync.Mutex
		committed = map[int64]time.Time{}
		handled   = map[int64]time.Time{}
		current   int64
	)
	consumer := dispatcher.Consumer{Name: "bench:latency", Apply: func(_ context.Context, _ *framework.Tx, env framework.Envelope) error {
		now := time.Now()
		e, ok, err := ticked.Decode(env)
		if err != nil || !ok {
			return err
		}
		mu.Lock()
		if _, dup := handled[e.Payload.N]; !dup {
			handled[e.Payload.N] = now
		}
		mu.Unlock()
		return nil
	}}
	d, err := dispatcher.New(pool, reg, []dispatcher.Consumer{consumer}, &dispatcher.Config{InstanceID: "bench-worker"})
	if err != nil {
		return nil, 0, err
	}
	rt, err := framework.NewRuntime(reg, pool, nil)
	if err != nil {
		return nil, 0, err
	}
	// The commit time is taken first thing after the COMMIT returned.
	rt.OnCommit(func(int) {
		now := time.Now()
		mu.Lock()
		committed[current] = now
		mu.Unlock()
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	waker := d
	if viaListen {
		api, err := dispatcher.New(pool, reg, nil, &dispatcher.Config{InstanceID: "bench-api"})
		if err != nil {
			return nil, 0, err
		}
		waker = api
		wg.Go(func() { _ = api.Run(runCtx) })
	}
	rt.OnCommit(func(int) { waker.Wake() })
	wg.Go(func() { _ = d.Run(runCtx) })
	// Let the LISTEN connections come up.
	time.Sleep(500 * time.Millisecond)

	interval := time.Second / time.Duration(rate)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	total := int64(dur / interval)
	for i := int64(0); i < total; i++ {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-ticker.C:
		}
		mu.Lock()
		current = i
		mu.Unlock()
		if _, err := rt.InTx(ctx, "tenant-1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "ticker", ID: strconv.FormatInt(i%50, 10)}, framework.AnyVersion,
				ticked.With(tick{N: i, Customer: "c"}))
		}); err != nil {
			return nil, 0, err
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(handled)
		mu.Unlock()
		if n >= int(total) {
			break
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("only %d of %d events handled", n, total)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	lat = make([]time.Duration, 0, total)
	for n, at := range handled {
		c, ok := committed[n]
		if !ok {
			return nil, 0, fmt.Errorf("event %d handled without a recorded commit", n)
		}
		lat = append(lat, max(at.Sub(c), 0))
	}
	return lat, 0, nil
}

// foreignHorizonHold samples, until ctx ends, the age of the oldest
// transaction holding an xid in another database and returns the largest.
func foreignHorizonHold(ctx context.Context, pool *pgxpool.Pool) time.Duration {
	var worst time.Duration
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var secs float64
		err := pool.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8
FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND datname <> current_database()`).Scan(&secs)
		if err == nil {
			worst = max(worst, time.Duration(secs*float64(time.Second)))
		}
		select {
		case <-ctx.Done():
			return worst
		case <-tick.C:
		}
	}
}
