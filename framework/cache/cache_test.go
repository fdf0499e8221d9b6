package cache_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/cache"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tokens is a ReadRouter over a real pool that records the consistency
// tokens queries ask for.
type tokens struct {
	pool *pgxpool.Pool
	mu   sync.Mutex
	seen []string
}

func (r *tokens) AcquireRead(ctx context.Context, token string) (*pgxpool.Conn, error) {
	r.mu.Lock()
	r.seen = append(r.seen, token)
	r.mu.Unlock()
	return r.pool.Acquire(ctx)
}

func (r *tokens) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[len(r.seen)-1]
}

// bundle is a runtime with the orders feature and a Redis cache, and (when
// started) a dispatcher running the invalidation consumer.
type bundle struct {
	db     *kumikotest.DB
	reg    *framework.Registry
	rt     *framework.Runtime
	cache  *cache.Cache
	router *tokens
}

// setup builds the bundle with a cache whose Redis calls may take 2 s: on
// a loaded machine the default 250 ms now and then passes, and a read the
// test expects from Redis goes to the database as after an error.
func setup(t *testing.T, rdb redis.UniversalClient, withConsumer bool) *bundle {
	t.Helper()
	return setupRead(t, rdb, withConsumer, 2*time.Second)
}

// setupRead is setup with the cache's ReadTimeout (0: its default).
func setupRead(t *testing.T, rdb redis.UniversalClient, withConsumer bool, readTimeout time.Duration) *bundle {
	t.Helper()
	b := &bundle{db: kumikotest.NewDB(t), reg: framework.NewRegistry()}
	orders.Register(b.reg)
	var err error
	b.cache, err = cache.New(rdb, &cache.Config{Prefix: "kumiko-test:cache:" + randomHex(6), Cooldown: 300 * time.Millisecond,
		ReadTimeout: readTimeout, Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	b.router = &tokens{pool: b.db.Pool}
	b.rt, err = framework.NewRuntime(b.reg, b.db.Pool, &framework.RuntimeConfig{QueryCache: b.cache, ReadRouter: b.router})
	require.NoError(t, err)
	if withConsumer {
		cons, ok := b.cache.Consumer(b.reg)
		require.True(t, ok)
		require.Equal(t, cache.ConsumerName, cons.Name)
		require.Equal(t, []string{"orders:event:cancelled"}, cons.EventTypes)
		d, err := dispatcher.New(b.db.Pool, b.reg, []dispatcher.Consumer{cons}, &dispatcher.Config{
			InstanceID: "cache-test", PollInterval: 20 * time.Millisecond})
		require.NoError(t, err)
		b.rt.OnCommit(func(int) { d.Wake() })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = d.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	return b
}

func call(tenant string) framework.Call {
	return framework.Call{Principal: framework.Principal{UserID: "u-" + tenant, TenantID: tenant}, RequestID: "req-" + randomHex(4)}
}

func (b *bundle) place(t *testing.T, tenant, customer string) string {
	t.Helper()
	out, err := b.rt.Write(t.Context(), call(tenant), []framework.Command{{Type: "orders:write:place",
		Payload: []byte(`{"customer":"` + customer + `","amountCents":100}`)}})
	require.NoError(t, err)
	return out[0].(orders.WriteResult).ID
}

func (b *bundle) get(t *testing.T, c framework.Call, id string) (orders.Order, error) {
	t.Helper()
	out, err := b.rt.Query(t.Context(), c, framework.Command{Type: "orders:query:get", Payload: []byte(`{"orderId":"` + id + `"}`)})
	if err != nil {
		return orders.Order{}, err
	}
	o, ok := out.(orders.Order)
	if !ok {
		return o, fmt.Errorf("a cached result must be decoded into the query's type, got %T", out)
	}
	return o, nil
}

func TestHitMissAndTokenSkipsCache(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Shared(t), false)
	id := b.place(t, "acme", "Ada")

	first, err := b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Equal(t, "Ada", first.Customer)
	require.Equal(t, cache.Stats{Misses: 1}, b.cache.Stats())

	// Change the row behind the framework's back: a hit cannot see it.
	_, err = b.db.Pool.Exec(t.Context(), `UPDATE orders SET customer = 'Changed' WHERE id = $1`, id)
	require.NoError(t, err)
	hit, err := b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Equal(t, "Ada", hit.Customer, "served from the cache")
	require.True(t, first.CreatedAt.Equal(hit.CreatedAt))
	first.CreatedAt, hit.CreatedAt = time.Time{}, time.Time{}
	require.Equal(t, first, hit)
	require.Equal(t, cache.Stats{Misses: 1, Hits: 1}, b.cache.Stats())

	// A query with a consistency token skips the cache.
	out, token, err := b.rt.WriteWithToken(t.Context(), call("acme"), []framework.Command{{Type: "orders:write:place",
		Payload: []byte(`{"customer":"Other","amountCents":1}`)}})
	require.NoError(t, err)
	require.NotNil(t, out)
	c := call("acme")
	c.ConsistencyToken = token
	fresh, err := b.get(t, c, id)
	require.NoError(t, err)
	require.Equal(t, "Changed", fresh.Customer)
	require.Equal(t, token, b.router.last())
	require.Equal(t, cache.Stats{Misses: 1, Hits: 1}, b.cache.Stats(), "the token read neither hit nor missed")
}

func TestInvalidationThroughAnEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Shared(t), true)
	id := b.place(t, "acme", "Ada")
	o, err := b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Equal(t, "placed", o.Status)
	_, err = b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.InDelta(t, 1, b.cache.Stats().Hits, 0)

	_, err = b.rt.Write(t.Context(), call("acme"), []framework.Command{{Type: "orders:write:cancel",
		Payload: []byte(`{"orderId":"` + id + `","expectedVersion":1}`)}})
	require.NoError(t, err)
	// The consumer delivers after the visibility horizon passes the event.
	require.Eventually(t, func() bool {
		o, err := b.get(t, call("acme"), id)
		return err == nil && o.Status == "cancelled"
	}, 30*time.Second, 20*time.Millisecond)
	st := b.cache.Stats()
	require.InDelta(t, 1, st.Invalidations, 0)

	// The reload after the invalidation read at or after the invalidation's
	// WAL position (the entity's stamp), and filled the cache again.
	require.True(t, framework.ValidConsistencyToken(b.router.last()), "stamp %q", b.router.last())
	before := b.cache.Stats().Hits
	o, err = b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Equal(t, "cancelled", o.Status)
	require.InDelta(t, before+1, b.cache.Stats().Hits, 0)
}

// TestSpellingsOfAnIDShareOneEntry reads an order by its upper-case id,
// which the validator accepts and Postgres reads as the same uuid: the
// entry is the one the lower-case id (and the Cancelled event) names, so
// the cancel invalidates it and the next upper-case read sees the cancel.
func TestSpellingsOfAnIDShareOneEntry(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Shared(t), true)
	id := b.place(t, "acme", "Ada")
	upper := strings.ToUpper(id)
	require.NotEqual(t, id, upper)
	o, err := b.get(t, call("acme"), upper)
	require.NoError(t, err)
	require.Equal(t, "placed", o.Status)
	_, err = b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Equal(t, cache.Stats{Misses: 1, Hits: 1}, b.cache.Stats(), "the lower-case read hits the upper-case read's entry")

	_, err = b.rt.Write(t.Context(), call("acme"), []framework.Command{{Type: "orders:write:cancel",
		Payload: []byte(`{"orderId":"` + id + `","expectedVersion":1}`)}})
	require.NoError(t, err)
	// Invalidations counts once the entry is dropped in Redis.
	require.Eventually(t, func() bool { return b.cache.Stats().Invalidations >= 1 }, 30*time.Second, 20*time.Millisecond)
	o, err = b.get(t, call("acme"), upper)
	require.NoError(t, err)
	require.Equal(t, "cancelled", o.Status, "the upper-case read is not served the entry from before the cancel")
}

func TestTenantsNeverShareEntries(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Shared(t), false)
	id := b.place(t, "acme", "Ada")
	_, err := b.get(t, call("acme"), id)
	require.NoError(t, err)
	_, err = b.get(t, call("acme"), id)
	require.NoError(t, err)
	_, err = b.get(t, call("globex"), id)
	require.ErrorIs(t, err, framework.ErrNotFound, "another tenant's cached order stays invisible")
	_, err = b.get(t, call("globex"), id)
	require.ErrorIs(t, err, framework.ErrNotFound, "and a miss is not cached")
}

func TestBadPayloadIsRejectedBeforeTheCache(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Shared(t), false)
	_, err := b.rt.Query(t.Context(), call("acme"), framework.Command{Type: "orders:query:get", Payload: []byte(`{"orderId":"nope"}`)})
	var ve *framework.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, cache.Stats{}, b.cache.Stats())
}

func TestRedisDownFallsBackToTheDatabase(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	b := setup(t, srv.Client(), false)
	id := b.place(t, "acme", "Ada")
	_, err := b.get(t, call("acme"), id)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(t.Context(), `UPDATE orders SET customer = 'Current' WHERE id = $1`, id)
	require.NoError(t, err)

	srv.Stop()
	o, err := b.get(t, call("acme"), id)
	require.NoError(t, err, "Redis down: the read goes to the database")
	require.Equal(t, "Current", o.Customer)
	require.InDelta(t, 1, b.cache.Stats().RedisErrors, 0)
	o, err = b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Equal(t, "Current", o.Customer)
	require.InDelta(t, 1, b.cache.Stats().Bypassed, 0, "within the cooldown Redis is not asked")

	srv.Start()
	require.Eventually(t, func() bool {
		_, err := b.get(t, call("acme"), id)
		return err == nil && b.cache.Stats().Hits >= 1
	}, 10*time.Second, 50*time.Millisecond, "the cache works again once Redis is back")
}

// A Redis that stops answering (it takes the connection and the command,
// and hangs) costs a cached read its ReadTimeout, not the client's read
// timeouts and retries: the read goes to the database, and the reads after
// it skip Redis for the cooldown.
func TestHangingRedisFallsBackWithinTheReadTimeout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// kumiko serve's client settings: a 10 s read timeout, 3 retries.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxRetries: 3})
	t.Cleanup(func() { _ = rdb.Close() })
	b := setupRead(t, rdb, false, 0)
	id := b.place(t, "acme", "Ada")
	_, err := b.get(t, call("acme"), id)
	require.NoError(t, err)

	srv.Freeze()
	defer srv.Thaw()
	start := time.Now()
	o, err := b.get(t, call("acme"), id)
	require.NoError(t, err, "Redis hangs: the read goes to the database")
	require.Equal(t, "Ada", o.Customer)
	require.Less(t, time.Since(start), 2*time.Second, "the read waited for the client's timeouts")
	require.InDelta(t, 1, b.cache.Stats().RedisErrors, 0)
	start = time.Now()
	_, err = b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 100*time.Millisecond)
	require.InDelta(t, 1, b.cache.Stats().Bypassed, 0, "within the cooldown Redis is not asked")
}

func TestFillRacingAnInvalidationIsDropped(t *testing.T) {
	t.Parallel()
	c, err := cache.New(redistest.Shared(t), &cache.Config{Prefix: "kumiko-test:cache:" + randomHex(6)})
	require.NoError(t, err)
	ctx := t.Context()
	v, stamp, err := c.Lookup(ctx, "acme", "q", "k")
	require.NoError(t, err)
	require.Nil(t, v)
	require.Empty(t, stamp)
	// The entity changes between the lookup and the fill.
	require.NoError(t, c.Invalidate(ctx, "acme", "q", "k", "0/1A", time.Minute))
	require.NoError(t, c.Fill(ctx, "acme", "q", "k", stamp, []byte(`"old"`), time.Minute))
	v, stamp, err = c.Lookup(ctx, "acme", "q", "k")
	require.NoError(t, err)
	require.Nil(t, v, "the old state was not cached")
	require.Equal(t, "0/1A", stamp)
	// A fill that saw the invalidation is stored.
	require.NoError(t, c.Fill(ctx, "acme", "q", "k", stamp, []byte(`"new"`), time.Minute))
	v, _, err = c.Lookup(ctx, "acme", "q", "k")
	require.NoError(t, err)
	require.Equal(t, `"new"`, string(v))
	// Keys are scoped: the same key of another tenant or query is empty.
	for _, other := range [][2]string{{"globex", "q"}, {"acme", "q2"}, {"acme:q", ""}} {
		v, _, err = c.Lookup(ctx, other[0], other[1], "k")
		require.NoError(t, err)
		require.Nil(t, v, "%v", other)
	}
}

func TestNoConsumerWithoutCachedQueries(t *testing.T) {
	t.Parallel()
	c, err := cache.New(redistest.Shared(t), nil)
	require.NoError(t, err)
	_, ok := c.Consumer(framework.NewRegistry())
	require.False(t, ok)
}

type otherInput struct {
	ID string `json:"id"`
}

func TestRegistrationProblems(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	f := reg.Feature("bad")
	other := framework.NewRegistry().Feature("elsewhere")
	foreign := framework.DefineEvent[otherInput](other, "foreign", nil)
	framework.Query(f, "wrong-type", func(context.Context, *framework.Tx, orders.GetInput) (string, error) { return "", nil },
		&framework.QueryOptions{Cache: framework.CacheBy(time.Minute, func(in otherInput) string { return in.ID })})
	framework.Query(f, "foreign-event", func(context.Context, *framework.Tx, otherInput) (string, error) { return "", nil },
		&framework.QueryOptions{Cache: framework.CacheBy(time.Minute, func(in otherInput) string { return in.ID },
			framework.InvalidatedBy(foreign, func(e framework.Event[otherInput]) string { return e.Payload.ID }))})
	err := reg.Build()
	require.ErrorContains(t, err, "bad:query:wrong-type: cache key takes cache_test.otherInput")
	require.ErrorContains(t, err, `bad:query:foreign-event: cache invalidated by undeclared event "elsewhere:event:foreign"`)
}

func TestUndecodableEntryIsReplaced(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Shared(t), false)
	id := b.place(t, "acme", "Ada")
	ctx := t.Context()
	// An entry of an older result shape, after an invalidation stamped it.
	require.NoError(t, b.cache.Invalidate(ctx, "acme", "orders:query:get", id, "0/1", time.Minute))
	require.NoError(t, b.cache.Fill(ctx, "acme", "orders:query:get", id, "0/1", []byte(`["not","an","order"]`), time.Minute))
	o, err := b.get(t, call("acme"), id)
	require.NoError(t, err)
	require.Equal(t, "Ada", o.Customer, "read from the database")
	v, _, err := b.cache.Lookup(ctx, "acme", "orders:query:get", id)
	require.NoError(t, err)
	require.Contains(t, string(v), `"customer":"Ada"`, "and the entry was replaced")
}

// A worker whose invalidations fail (here: its Redis user loses its
// permissions, as a worker cut off from Redis would) leaves the entries of
// the entities changed meanwhile in Redis. The guard of an API process
// that still reaches Redis sees the failure in the consumer's state row
// and sends reads to the database until the retry delivered the
// invalidation; without it, reads answered the old state.
func TestGuardHoldsTheCacheWhileAnInvalidationWaits(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := t.Context()
	admin := srv.Client()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "worker", "on", ">worker-secret", "~*", "+@all").Err())
	workerRDB := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "worker", Password: "worker-secret", MaxRetries: -1})
	t.Cleanup(func() { _ = workerRDB.Close() })

	prefix := "kumiko-test:cache:" + randomHex(6)
	b := &bundle{db: kumikotest.NewDB(t), reg: framework.NewRegistry()}
	orders.Register(b.reg)
	var err error
	b.cache, err = cache.New(admin, &cache.Config{Prefix: prefix, Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	worker, err := cache.New(workerRDB, &cache.Config{Prefix: prefix})
	require.NoError(t, err)
	b.router = &tokens{pool: b.db.Pool}
	b.rt, err = framework.NewRuntime(b.reg, b.db.Pool, &framework.RuntimeConfig{QueryCache: b.cache, ReadRouter: b.router})
	require.NoError(t, err)
	cons, ok := worker.Consumer(b.reg)
	require.True(t, ok)
	d, err := dispatcher.New(b.db.Pool, b.reg, []dispatcher.Consumer{cons}, &dispatcher.Config{
		InstanceID: "cache-worker", PollInterval: 20 * time.Millisecond, RetryBaseDelay: 100 * time.Millisecond})
	require.NoError(t, err)
	b.rt.OnCommit(func(int) { d.Wake() })
	guard := b.cache.Guard(b.db.Pool, 20*time.Millisecond)
	require.True(t, b.cache.Held(), "held until the guard read the consumer's state")
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(runCtx) })
	wg.Go(func() { _ = guard.Run(runCtx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	require.Eventually(t, func() bool { return !b.cache.Held() }, 10*time.Second, 10*time.Millisecond,
		"released once the consumer is registered and not failing")

	id := b.place(t, "acme", "Ada")
	for range 2 {
		o, err := b.get(t, call("acme"), id)
		require.NoError(t, err)
		require.Equal(t, "placed", o.Status)
	}
	require.Equal(t, cache.Stats{Misses: 1, Hits: 1}, b.cache.Stats())

	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "worker", "-@all").Err())
	_, err = b.rt.Write(ctx, call("acme"), []framework.Command{{Type: "orders:write:cancel",
		Payload: []byte(`{"orderId":"` + id + `","expectedVersion":1}`)}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := dispatcher.Status(ctx, b.db.Pool, cache.ConsumerName, dispatcher.SharedInstance)
		return err == nil && st.Attempts > 0
	}, 10*time.Second, 10*time.Millisecond, "the invalidation fails")
	// The guard sees the failure within its interval (the window in which
	// a read may still answer the old state).
	require.Eventually(t, b.cache.Held, 5*time.Second, 10*time.Millisecond, "held while the invalidation waits")
	hits, bypassed := b.cache.Stats().Hits, b.cache.Stats().Bypassed
	for range 3 {
		o, err := b.get(t, call("acme"), id)
		require.NoError(t, err)
		require.Equal(t, "cancelled", o.Status, "a held cache must not answer the old state")
	}
	require.InDelta(t, hits, b.cache.Stats().Hits, 0, "no read came from Redis meanwhile")
	require.InDelta(t, bypassed+3, b.cache.Stats().Bypassed, 0)

	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "worker", "+@all").Err())
	require.Eventually(t, func() bool { return !b.cache.Held() }, 10*time.Second, 10*time.Millisecond,
		"released once the retry delivered the invalidation")
	for range 2 {
		o, err := b.get(t, call("acme"), id)
		require.NoError(t, err)
		require.Equal(t, "cancelled", o.Status)
	}
	require.InDelta(t, hits+1, b.cache.Stats().Hits, 0, "the cache answers again")
}

// The guard starts held; when its first read of the consumer's state keeps
// it held, it says why in the log (the gauge alone did), and a release at
// its first read is not logged.
func TestGuardLogsWhyItStaysHeldAtBoot(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	orders.Register(reg)
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	c, err := cache.New(redistest.Shared(t), &cache.Config{Prefix: "kumiko-test:cache:" + randomHex(6), Logger: logger})
	require.NoError(t, err)
	cons, ok := c.Consumer(reg)
	require.True(t, ok)
	d, err := dispatcher.New(db.Pool, reg, []dispatcher.Consumer{cons}, &dispatcher.Config{InstanceID: "boot"})
	require.NoError(t, err)
	require.NoError(t, d.Register(t.Context()))
	require.NoError(t, dispatcher.Disable(t.Context(), db.Pool, cache.ConsumerName, ""))

	read := func() string { mu.Lock(); defer mu.Unlock(); return logs.String() }
	// runGuard runs a new guard until cond holds and it read the state
	// twice more.
	runGuard := func(cond func() bool) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Guard(db.Pool, 10*time.Millisecond).Run(ctx) }()
		require.Eventually(t, cond, 10*time.Second, 5*time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		cancel()
		<-done
	}
	runGuard(func() bool { return strings.Contains(read(), "the invalidation consumer is disabled") })
	require.True(t, c.Held())

	require.NoError(t, dispatcher.Enable(t.Context(), db.Pool, cache.ConsumerName, ""))
	mu.Lock()
	logs.Reset()
	mu.Unlock()
	runGuard(func() bool { return !c.Held() })
	require.NotContains(t, read(), "cache released", "a release at the first read is no news")
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestSystemTenantReadsAreNotCached: a query of the system tenant (Go code
// such as a cron job calling Runtime.Query) sees every tenant's rows, but
// invalidations name the tenant of the event: an entry filled under the
// system tenant was never invalidated and answered the order as placed
// after its cancel, for the whole TTL.
func TestSystemTenantReadsAreNotCached(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.Shared(t), true)
	id := b.place(t, "acme", "Ada")
	system := call(framework.SystemTenantID)
	o, err := b.get(t, system, id)
	require.NoError(t, err)
	require.Equal(t, "placed", o.Status)

	_, err = b.rt.Write(t.Context(), call("acme"), []framework.Command{{Type: "orders:write:cancel",
		Payload: []byte(`{"orderId":"` + id + `","expectedVersion":1}`)}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.cache.Stats().Invalidations >= 1 }, 30*time.Second, 20*time.Millisecond)
	o, err = b.get(t, system, id)
	require.NoError(t, err)
	require.Equal(t, "cancelled", o.Status, "the system tenant's read is not served an entry no invalidation reaches")
}

// TestCallersDeadlineIsNoRedisFailure: a lookup or fill whose caller's
// context ends (a Go caller's deadline, a job's timeout) says nothing
// about Redis. Only a cancel was recognised: a caller's deadline counted
// as a Redis error and opened the cooldown, sending every cached read of
// the process to the database for a second.
func TestCallersDeadlineIsNoRedisFailure(t *testing.T) {
	t.Parallel()
	c, err := cache.New(redistest.Shared(t), &cache.Config{Prefix: "kumiko-test:cache:" + randomHex(6), Cooldown: time.Minute})
	require.NoError(t, err)
	expired, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	_, _, err = c.Lookup(expired, "acme", "q", "k")
	require.Error(t, err)
	require.Error(t, c.Fill(expired, "acme", "q", "k", "", []byte(`"v"`), time.Minute))
	require.Equal(t, cache.Stats{}, c.Stats(), "no Redis error counted")
	require.NoError(t, c.Fill(t.Context(), "acme", "q", "k", "", []byte(`"v"`), time.Minute), "no cooldown")
	v, _, err := c.Lookup(t.Context(), "acme", "q", "k")
	require.NoError(t, err, "no cooldown")
	require.Equal(t, `"v"`, string(v))
}

// TestCachedQueryOfAnInterfaceInputWithoutPayload: the key function of a
// cached query whose input type is an interface (any) gets the nil
// interface for an absent or null payload; CacheBy asserted the input to
// In, which panics on a nil interface, so every such call panicked.
func TestCachedQueryOfAnInterfaceInputWithoutPayload(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	framework.Query(reg.Feature("loose"), "cached", func(ctx context.Context, tx *framework.Tx, in any) (string, error) {
		return fmt.Sprint(in), nil
	}, &framework.QueryOptions{Cache: framework.CacheBy(time.Minute, func(in any) string { return fmt.Sprint(in) })})
	c, err := cache.New(redistest.Shared(t), &cache.Config{Prefix: "kumiko-test:cache:" + randomHex(6), Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	rt, err := framework.NewRuntime(reg, db.Pool, &framework.RuntimeConfig{QueryCache: c})
	require.NoError(t, err)
	for _, payload := range []string{``, `null`, `null`} {
		var out any
		require.NotPanics(t, func() {
			out, err = rt.Query(t.Context(), call("acme"), framework.Command{Type: "loose:query:cached", Payload: json.RawMessage(payload)})
		}, "payload %q", payload)
		require.NoError(t, err)
		require.Equal(t, "<nil>", out)
	}
}

// TestGuardWarnsOnceWhileTheDatabaseIsDown: a guard that cannot read the
// consumer's state keeps its hold and warns once, not on every read (every
// 500 ms by default, for as long as the database is down).
func TestGuardWarnsOnceWhileTheDatabaseIsDown(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	c, err := cache.New(redistest.Shared(t), &cache.Config{Prefix: "kumiko-test:cache:" + randomHex(6), Logger: logger})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	pool, err := pgxpool.New(t.Context(), "postgres://postgres@"+addr+"/none?connect_timeout=1")
	require.NoError(t, err)
	defer pool.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
	defer cancel()
	require.NoError(t, c.Guard(pool, 5*time.Millisecond).Run(ctx))
	mu.Lock()
	out := logs.String()
	mu.Unlock()
	require.Equal(t, 1, strings.Count(out, "cache guard: read the invalidation consumer's state"), "%s", out)
	require.True(t, c.Held())
}

// TestFillOutlivingTheInvalidationMarkIsDropped: an invalidation's stamp
// lives one TTL. A load slower than that could see the stamp expire and
// then fill the state it read before the invalidation, which would stay
// cached for a whole TTL; such a fill is skipped.
func TestFillOutlivingTheInvalidationMarkIsDropped(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	entered, release := make(chan struct{}), make(chan struct{})
	framework.Query(reg.Feature("slow"), "get", func(ctx context.Context, tx *framework.Tx, in string) (string, error) {
		close(entered)
		<-release
		return "before the invalidation", nil
	}, &framework.QueryOptions{Cache: framework.CacheBy(ttl, func(in string) string { return in })})
	c, err := cache.New(redistest.Shared(t), &cache.Config{Prefix: "kumiko-test:cache:" + randomHex(6), Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	rt, err := framework.NewRuntime(reg, db.Pool, &framework.RuntimeConfig{QueryCache: c})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := rt.Query(t.Context(), call("acme"), framework.Command{Type: "slow:query:get", Payload: []byte(`"k"`)})
		done <- err
	}()
	<-entered // looked up (a miss), now loading
	ctx := t.Context()
	require.NoError(t, c.Invalidate(ctx, "acme", "slow:query:get", "k", "0/1A", ttl))
	require.Eventually(t, func() bool {
		_, stamp, err := c.Lookup(ctx, "acme", "slow:query:get", "k")
		return err == nil && stamp == ""
	}, 10*time.Second, 20*time.Millisecond, "the invalidation's stamp expires")
	close(release)
	require.NoError(t, <-done)
	v, _, err := c.Lookup(ctx, "acme", "slow:query:get", "k")
	require.NoError(t, err)
	require.Nil(t, v, "the state loaded before the invalidation was cached: %s", v)
}
