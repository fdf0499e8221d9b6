package main

// Benchmarks of idempotent writes and the entity cache (issue #6). Helper
// names start with "rd" so that other benchmark files keep theirs free.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/cache"
	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/redisauto"
)

func init() {
	register(Bench{Name: "idempotency-overhead", Run: benchIdempotency})
	register(Bench{Name: "cache-get", Run: benchCacheGet})
}

// rdRedis returns a Redis for a benchmark: KUMIKO_BENCH_REDIS_URL when
// set, else a private redis-server on a free loopback port (so that other
// load on the shared Redis does not skew the figures), else REDIS_URL or
// the local default. stop ends what rdRedis started.
func rdRedis(ctx context.Context) (rdb *redis.Client, stop func(), err error) {
	url := os.Getenv("KUMIKO_BENCH_REDIS_URL")
	stop = func() {}
	if url == "" {
		if addr, kill, err := rdPrivateRedis(ctx); err == nil {
			url, stop = "redis://"+addr+"/0", kill
		} else {
			fmt.Fprintf(os.Stderr, "   no private redis-server (%v), using the shared one\n", err)
		}
	}
	if url == "" {
		url = cmp.Or(os.Getenv("REDIS_URL"), "redis://127.0.0.1:6379/0")
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		stop()
		return nil, nil, err
	}
	opts.PoolSize = 64
	c := redis.NewClient(opts)
	if err := c.Ping(ctx).Err(); err != nil {
		_ = c.Close()
		stop()
		return nil, nil, fmt.Errorf("redis %s: %w", url, err)
	}
	kill := stop
	return c, func() { _ = c.Close(); kill() }, nil
}

// rdPrivateRedis starts redis-server without persistence on a free port.
func rdPrivateRedis(ctx context.Context) (string, func(), error) {
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	kill := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c.Ping(ctx).Err() == nil {
			return addr, kill, nil
		}
		if time.Now().After(deadline) {
			kill()
			return "", nil, fmt.Errorf("redis-server on %s does not answer", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rdDropPrefix deletes the keys under prefix.
func rdDropPrefix(rdb *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
}

func rdHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// rdServer is a Kumiko HTTP server on a loopback port with its clients'
// tokens.
type rdServer struct {
	client *loadClient
	auths  []header
	close  func()
}

// rdServe serves rt with store (nil: no idempotency) for workers clients,
// one user each, spread over 4 tenants; wrap (when not nil) wraps the
// server's handler.
func rdServe(ctx context.Context, rt *framework.Runtime, store *idempotency.Store, workers int, wrap func(http.Handler) http.Handler) (*rdServer, error) {
	keys, err := auth.NewKeyring([]auth.Key{{ID: "bench", Secret: []byte("bench-secret-0123456789abcdef0123")}})
	if err != nil {
		return nil, err
	}
	h := web.New(rt, keys, &web.Config{Idempotency: store}).Handler()
	if wrap != nil {
		h = wrap(h)
	}
	srv := benchHTTPServer(h)
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.Serve(ln) }()
	s := &rdServer{client: newLoadClient(ln.Addr().String(), workers)}
	s.close = func() { s.client.close(); _ = srv.Close() }
	for w := range workers {
		tok, err := keys.Mint(auth.Principal{UserID: "bench-" + strconv.Itoa(w), TenantID: "tenant-" + strconv.Itoa(w%4)}, time.Hour)
		if err != nil {
			s.close()
			return nil, err
		}
		s.auths = append(s.auths, header{"Authorization", "Bearer " + tok})
	}
	return s, nil
}

// post sends body to path as worker w, with its token and the extra
// headers, and fails on anything but 200.
func (s *rdServer) post(ctx context.Context, w int, path string, body []byte, extra ...header) ([]byte, error) {
	headers := append([]header{s.auths[w]}, extra...)
	status, b, err := s.client.post(ctx, w, path, body, headers...)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %d %s", path, status, b)
	}
	return b, nil
}

// rdRun runs op from workers goroutines for d and returns operations per
// second and every operation's latency.
func rdRun(ctx context.Context, workers int, d time.Duration, op func(ctx context.Context, w, i int) error) (float64, []time.Duration, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		lats     []time.Duration
		firstErr error
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				t0 := time.Now()
				if err := op(ctx, w, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
						cancel()
					}
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, nil, firstErr
	}
	return float64(len(lats)) / time.Since(start).Seconds(), lats, nil
}

// rdSide is one side of an rdCompare.
type rdSide struct {
	name string
	op   func(ctx context.Context, w, i int) error
}

// rdTotal is what rdCompare measured of one side.
type rdTotal struct {
	ops     int
	elapsed time.Duration
	lats    []time.Duration
	// cpu is the CPU time the side cost (rdMeter), zero without a meter.
	cpu rdCPU
}

func (t rdTotal) rate() float64 { return float64(t.ops) / t.elapsed.Seconds() }

// rdCPU is CPU time spent by this process (the server and its HTTP
// clients), the database's backends and Redis.
type rdCPU struct{ goCPU, pgCPU, redisCPU time.Duration }

func (c rdCPU) sub(o rdCPU) rdCPU {
	return rdCPU{c.goCPU - o.goCPU, c.pgCPU - o.pgCPU, c.redisCPU - o.redisCPU}
}

func (c rdCPU) add(o rdCPU) rdCPU {
	return rdCPU{c.goCPU + o.goCPU, c.pgCPU + o.pgCPU, c.redisCPU + o.redisCPU}
}

// perOp renders c spread over ops operations.
func (c rdCPU) perOp(ops int) string {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(max(ops, 1)) }
	return fmt.Sprintf("go %.0f µs + pg %.0f µs + redis %.0f µs", per(c.goCPU), per(c.pgCPU), per(c.redisCPU))
}

// rdMeter reads the CPU time of this process, of a database's backends and
// of a Redis server: on a machine where all of them share the cores, it
// shows which of them a side's extra work lands on.
type rdMeter struct {
	pg  *evMeter
	rdb *redis.Client
}

func newRDMeter(ctx context.Context, pool *pgxpool.Pool, rdb *redis.Client) *rdMeter {
	return &rdMeter{pg: newEvMeter(ctx, pool), rdb: rdb}
}

func (m *rdMeter) read(ctx context.Context) rdCPU {
	return rdCPU{goCPU: processCPU(), pgCPU: m.pg.pgCPU(), redisCPU: rdRedisCPU(ctx, m.rdb)}
}

// rdRedisCPU is the server's used_cpu_sys + used_cpu_user (0 when INFO
// fails).
func rdRedisCPU(ctx context.Context, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// rdCompare runs the sides in n slices of d each, in rotating order, so
// that drift (tables and Redis growing, load from elsewhere) hits every
// side alike; it reports each side's pooled rate and latencies (and CPU
// time per operation when meter is not nil) and prints the median of the
// per-slice ratios to the second side.
func rdCompare(ctx context.Context, name string, workers int, d time.Duration, n int, meter *rdMeter, sides ...rdSide) ([]rdTotal, error) {
	totals := make([]rdTotal, len(sides))
	ratios := make([]float64, 0, n)
	for i := range n {
		rates := make([]float64, len(sides))
		for k := range sides {
			j := (i + k) % len(sides)
			var cpu0 rdCPU
			if meter != nil {
				cpu0 = meter.read(ctx)
			}
			start := time.Now()
			rate, lats, err := rdRun(ctx, workers, d, sides[j].op)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", name, sides[j].name, err)
			}
			if meter != nil {
				totals[j].cpu = totals[j].cpu.add(meter.read(ctx).sub(cpu0))
			}
			rates[j] = rate
			totals[j].ops += len(lats)
			totals[j].elapsed += time.Since(start)
			totals[j].lats = append(totals[j].lats, lats...)
		}
		ratios = append(ratios, rates[0]/rates[1])
	}
	fmt.Fprintf(os.Stderr, "   %s, %d slices of %s per side:\n", name, n, d)
	for j, side := range sides {
		fmt.Fprintf(os.Stderr, "     %-44s %8.0f/s  p50 %.2f ms\n", side.name, totals[j].rate(), ms(quantile(totals[j].lats, 0.5)))
		if meter != nil {
			fmt.Fprintf(os.Stderr, "       CPU per request: %s\n", totals[j].cpu.perOp(totals[j].ops))
		}
	}
	fmt.Fprintf(os.Stderr, "     median slice ratio %.2f\n", median(ratios))
	return totals, nil
}

// rdDB creates a fresh database with a pool of maxConns.
func rdDB(ctx context.Context, maxConns int32) (*pgxpool.Pool, func(), error) {
	db, drop, err := kumikotest.CreateDB(ctx, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("create database: %w", err)
	}
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		drop()
		return nil, nil, err
	}
	pc.MaxConns, pc.MinConns = maxConns, maxConns
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}

// benchIdempotency: POST /api/write orders:write:place with a fresh
// Idempotency-Key per request (claim + finish in Redis) against the same
// request without a key, both through the real server at 16 clients, in
// slices of rotating order. A third side, reported without a target, is
// the unkeyed request plus one Redis PING: the floor of a claim's round
// trip.
func benchIdempotency(ctx context.Context, env *Env) ([]Result, error) {
	const workers = 16
	pool, drop, err := rdDB(ctx, workers)
	if err != nil {
		return nil, err
	}
	defer drop()
	rdb, stopRedis, err := rdRedis(ctx)
	if err != nil {
		return nil, err
	}
	defer stopRedis()
	prefix := "kumiko-bench:idem:" + rdHex(6)
	defer rdDropPrefix(rdb, prefix)
	store, err := idempotency.New(rdb, &idempotency.Config{Prefix: prefix, TTL: 30 * time.Minute})
	if err != nil {
		return nil, err
	}
	reg := framework.NewRegistry()
	orders.Register(reg)
	rt, err := framework.NewRuntime(reg, pool, nil)
	if err != nil {
		return nil, err
	}
	s, err := rdServe(ctx, rt, store, workers, rdPingFirst(redisauto.New(rdb)))
	if err != nil {
		return nil, err
	}
	defer s.close()
	body := []byte(`{"type":"orders:write:place","payload":{"customer":"acme","amountCents":1250}}`)
	run := rdHex(4)
	var seq atomic.Int64 // a fresh key for every request
	keyed := func(ctx context.Context, w, _ int) error {
		_, err := s.post(ctx, w, "/api/write", body, header{web.HeaderIdempotencyKey, run + "-" + strconv.FormatInt(seq.Add(1), 10)})
		return err
	}
	plain := func(ctx context.Context, w, _ int) error {
		_, err := s.post(ctx, w, "/api/write", body)
		return err
	}
	pinged := func(ctx context.Context, w, _ int) error {
		_, err := s.post(ctx, w, "/api/write", body, header{headerBenchPing, "1"})
		return err
	}
	d, slices := 1200*time.Millisecond, 10
	if env.Quick {
		d, slices = 400*time.Millisecond, 2
	}
	for _, op := range []func(context.Context, int, int) error{plain, keyed, pinged} {
		if _, _, err := rdRun(ctx, workers, d, op); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	probe := rdProbe(ctx, rdb) // the cost of one Redis round trip under this load
	totals, err := rdCompare(ctx, "idempotency, 16 clients", workers, d, slices, newRDMeter(ctx, pool, rdb),
		rdSide{name: "POST /api/write with a fresh Idempotency-Key", op: keyed},
		rdSide{name: "POST /api/write without a key", op: plain},
		rdSide{name: "the same, plus one Redis PING per request", op: pinged})
	rtt := probe()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "     a Redis round trip meanwhile: p50 %.2f ms\n", ms(rtt))
	// Every keyed request (each with a fresh key) claimed its key: one
	// stored key per request, so a store that skipped claims cannot pass
	// for a cheap one.
	var stored int64
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		stored++
	}
	if err := iter.Err(); err != nil {
		return nil, err
	}
	if keyedN := seq.Load(); stored != keyedN {
		return nil, fmt.Errorf("%d keyed requests answered, but %d idempotency keys stored", keyedN, stored)
	}
	throughput := ratioResult("POST /api/write orders:write:place with a fresh Idempotency-Key, 16 clients", "req/s",
		totals[0].rate(), "the same without a key", totals[1].rate(), 0.85)
	added := ms(quantile(totals[0].lats, 0.5)) - ms(quantile(totals[1].lats, 0.5))
	latency := Result{
		Name: "idempotency: p50 added to POST /api/write, 16 clients", Value: added, Unit: "ms",
		Target: "<= 1 ms", Pass: added <= 1,
	}
	// The floor of any design that asks Redis once per request, as the
	// claim must.
	floor := referenceResult("reference: POST /api/write without a key, plus one Redis PING per request", "req/s",
		totals[2].rate(), "the same without the PING", totals[1].rate())
	return []Result{throughput, latency, floor}, nil
}

// headerBenchPing marks a request that rdPingFirst sends a PING for.
const headerBenchPing = "X-Bench-Redis-Ping"

// rdPingFirst wraps a handler: a request carrying headerBenchPing first
// PINGs Redis through cmd (the idempotency store's autopipeliner), a
// round trip like a claim's but with no work in Redis.
func rdPingFirst(cmd *redisauto.Client) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get(headerBenchPing) != "" {
				// Bounded like a claim (idempotency.Config.CallTimeout).
				ctx, cancel := context.WithTimeout(r.Context(), idempotency.DefaultCallTimeout)
				err := cmd.Do(ctx, redis.NewStatusCmd(ctx, "ping"))
				cancel()
				if err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// rdProbe PINGs Redis every 5 ms until the returned function is called,
// which returns the median round trip.
func rdProbe(ctx context.Context, rdb *redis.Client) func() time.Duration {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan []time.Duration)
	go func() {
		var rtts []time.Duration
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- rtts
				return
			case <-t.C:
			}
			t0 := time.Now()
			if rdb.Ping(ctx).Err() == nil {
				rtts = append(rtts, time.Since(t0))
			}
		}
	}()
	return func() time.Duration { cancel(); return quantile(<-done, 0.5) }
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// benchCacheGet: POST /api/query orders:query:get answered from the Redis
// entity cache against the same query reading the database, both through
// the real server at 32 clients, over 256 orders, in alternating rounds.
func benchCacheGet(ctx context.Context, env *Env) ([]Result, error) {
	const workers, nOrders = 32, 256
	pool, drop, err := rdDB(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer drop()
	rdb, stopRedis, err := rdRedis(ctx)
	if err != nil {
		return nil, err
	}
	defer stopRedis()
	prefix := "kumiko-bench:cache:" + rdHex(6)
	defer rdDropPrefix(rdb, prefix)
	c, err := cache.New(rdb, &cache.Config{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	reg := framework.NewRegistry()
	orders.Register(reg)
	cachedRT, err := framework.NewRuntime(reg, pool, &framework.RuntimeConfig{QueryCache: c})
	if err != nil {
		return nil, err
	}
	plainRT, err := framework.NewRuntime(reg, pool, nil)
	if err != nil {
		return nil, err
	}
	cached, err := rdServe(ctx, cachedRT, nil, workers, nil)
	if err != nil {
		return nil, err
	}
	defer cached.close()
	plain, err := rdServe(ctx, plainRT, nil, workers, nil)
	if err != nil {
		return nil, err
	}
	defer plain.close()
	// Orders per tenant; worker w reads its tenant's orders.
	ids := map[int][]string{}
	for i := range nOrders {
		w := i % 4
		b, err := plain.post(ctx, w, "/api/write", []byte(`{"type":"orders:write:place","payload":{"customer":"c`+strconv.Itoa(i)+`","amountCents":100}}`))
		if err != nil {
			return nil, err
		}
		var out struct{ Data orders.WriteResult }
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, err
		}
		ids[w] = append(ids[w], out.Data.ID)
	}
	bodies := map[int][][]byte{}
	for w, list := range ids {
		for _, id := range list {
			bodies[w] = append(bodies[w], []byte(`{"type":"orders:query:get","payload":{"orderId":"`+id+`"}}`))
		}
	}
	get := func(s *rdServer) func(ctx context.Context, w, i int) error {
		return func(ctx context.Context, w, i int) error {
			list := bodies[w%4]
			_, err := s.post(ctx, w, "/api/query", list[(i*7+w)%len(list)])
			return err
		}
	}
	d, slices := 1200*time.Millisecond, 10
	if env.Quick {
		d, slices = 400*time.Millisecond, 2
	}
	for _, s := range []*rdServer{plain, cached} {
		if _, _, err := rdRun(ctx, workers, d, get(s)); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	before := c.Stats()
	totals, err := rdCompare(ctx, "cache-get, 32 clients", workers, d, slices, newRDMeter(ctx, pool, rdb),
		rdSide{name: "orders:query:get from the entity cache", op: get(cached)},
		rdSide{name: "orders:query:get from the database", op: get(plain)})
	if err != nil {
		return nil, err
	}
	after := c.Stats()
	if hits := after.Hits - before.Hits; hits == 0 || after.Misses != before.Misses || after.RedisErrors > 0 {
		return nil, fmt.Errorf("cached runs were not all hits: %+v -> %+v", before, after)
	}
	return []Result{ratioResult("POST /api/query orders:query:get from the entity cache, 32 clients", "req/s",
		totals[0].rate(), "the same query from the database", totals[1].rate(), 2)}, nil
}
