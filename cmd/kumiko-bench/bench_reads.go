package main

// Benchmarks of idempotent writes and the entity cache (issue #6). Helper
// names start with "rd" so that other benchmark files keep theirs free.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
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
	url    string
	client *http.Client
	tokens []string
	close  func()
}

// rdServe serves rt with store (nil: no idempotency) for workers clients,
// one user each, spread over 4 tenants.
func rdServe(ctx context.Context, rt *framework.Runtime, store *idempotency.Store, workers int) (*rdServer, error) {
	keys, err := auth.NewKeyring([]auth.Key{{ID: "bench", Secret: []byte("bench-secret-0123456789abcdef0123")}})
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: web.New(rt, keys, &web.Config{Idempotency: store}).Handler(), ReadHeaderTimeout: 10 * time.Second}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.Serve(ln) }()
	s := &rdServer{url: "http://" + ln.Addr().String(), client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 2 * workers, MaxIdleConnsPerHost: 2 * workers, IdleConnTimeout: time.Minute,
	}}}
	s.close = func() { s.client.CloseIdleConnections(); _ = srv.Close() }
	for w := range workers {
		tok, err := keys.Mint(auth.Principal{UserID: "bench-" + strconv.Itoa(w), TenantID: "tenant-" + strconv.Itoa(w%4)}, time.Hour)
		if err != nil {
			s.close()
			return nil, err
		}
		s.tokens = append(s.tokens, tok)
	}
	return s, nil
}

// post sends body to path as worker w and fails on anything but 200.
func (s *rdServer) post(ctx context.Context, w int, path string, body []byte, key string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.tokens[w])
	if key != "" {
		req.Header.Set(web.HeaderIdempotencyKey, key)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, b)
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
// alternating rounds.
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
	s, err := rdServe(ctx, rt, store, workers)
	if err != nil {
		return nil, err
	}
	defer s.close()
	body := []byte(`{"type":"orders:write:place","payload":{"customer":"acme","amountCents":1250}}`)
	run := rdHex(4)
	keyed := func(ctx context.Context, w, i int) error {
		_, err := s.post(ctx, w, "/api/write", body, run+"-"+strconv.Itoa(w)+"-"+strconv.Itoa(i))
		return err
	}
	plain := func(ctx context.Context, w, _ int) error {
		_, err := s.post(ctx, w, "/api/write", body, "")
		return err
	}
	d, rounds := 4*time.Second, 3
	if env.Quick {
		d, rounds = time.Second, 1
	}
	for _, op := range []func(context.Context, int, int) error{plain, keyed} {
		if _, _, err := rdRun(ctx, workers, d/4, op); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	var keyedRates, plainRates, keyedP50, plainP50 []float64
	for r := range rounds {
		run = rdHex(4)             // fresh keys every round
		probe := rdProbe(ctx, rdb) // the cost of one Redis round trip under this load
		pr, pl, err := rdRun(ctx, workers, d, plain)
		rtt := probe()
		if err != nil {
			return nil, err
		}
		kr, kl, err := rdRun(ctx, workers, d, keyed)
		if err != nil {
			return nil, err
		}
		pp, kp := ms(quantile(pl, 0.5)), ms(quantile(kl, 0.5))
		fmt.Fprintf(os.Stderr, "   idempotency round %d: keyed %.0f req/s p50 %.2f ms, unkeyed %.0f req/s p50 %.2f ms (a Redis round trip meanwhile: p50 %.2f ms)\n",
			r+1, kr, kp, pr, pp, ms(rtt))
		keyedRates, plainRates = append(keyedRates, kr), append(plainRates, pr)
		keyedP50, plainP50 = append(keyedP50, kp), append(plainP50, pp)
	}
	// Every keyed request ran once: one event per stored key.
	var stored int64
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		stored++
	}
	if stored == 0 {
		return nil, fmt.Errorf("no idempotency keys stored")
	}
	throughput := Result{
		Name: "POST /api/write orders:write:place with a fresh Idempotency-Key, 16 clients", Value: median(keyedRates), Unit: "req/s",
		Baseline: "the same without a key", BaselineValue: median(plainRates), Target: ">= 0.85",
	}
	throughput.Pass = throughput.Ratio() >= 0.85
	added := median(keyedP50) - median(plainP50)
	latency := Result{
		Name: "idempotency: p50 added to POST /api/write, 16 clients", Value: added, Unit: "ms",
		Target: "<= 1 ms", Pass: added <= 1,
	}
	return []Result{throughput, latency}, nil
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
	cached, err := rdServe(ctx, cachedRT, nil, workers)
	if err != nil {
		return nil, err
	}
	defer cached.close()
	plain, err := rdServe(ctx, plainRT, nil, workers)
	if err != nil {
		return nil, err
	}
	defer plain.close()
	// Orders per tenant; worker w reads its tenant's orders.
	ids := map[int][]string{}
	for i := range nOrders {
		w := i % 4
		b, err := plain.post(ctx, w, "/api/write", []byte(`{"type":"orders:write:place","payload":{"customer":"c`+strconv.Itoa(i)+`","amountCents":100}}`), "")
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
			_, err := s.post(ctx, w, "/api/query", list[(i*7+w)%len(list)], "")
			return err
		}
	}
	d, rounds := 4*time.Second, 3
	if env.Quick {
		d, rounds = time.Second, 1
	}
	for _, s := range []*rdServer{plain, cached} {
		if _, _, err := rdRun(ctx, workers, d/4, get(s)); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	before := c.Stats()
	var cachedRates, plainRates []float64
	for r := range rounds {
		pr, _, err := rdRun(ctx, workers, d, get(plain))
		if err != nil {
			return nil, err
		}
		cr, _, err := rdRun(ctx, workers, d, get(cached))
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "   cache-get round %d: cached %.0f req/s, uncached %.0f req/s (%.2f)\n", r+1, cr, pr, cr/pr)
		cachedRates, plainRates = append(cachedRates, cr), append(plainRates, pr)
	}
	after := c.Stats()
	if hits := after.Hits - before.Hits; hits == 0 || after.Misses != before.Misses || after.RedisErrors > 0 {
		return nil, fmt.Errorf("cached runs were not all hits: %+v -> %+v", before, after)
	}
	res := Result{
		Name: "POST /api/query orders:query:get from the entity cache, 32 clients", Value: median(cachedRates), Unit: "req/s",
		Baseline: "the same query from the database", BaselineValue: median(plainRates), Target: ">= 2",
	}
	res.Pass = res.Ratio() >= 2
	return []Result{res}, nil
}
