package cache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/internal/redisauto"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	kmetrics "github.com/kumiko-go/kumiko/framework/metrics"
)

// ConsumerName is the persistent name of the invalidation consumer; never
// rename it.
const ConsumerName = "system:consumer:cache-invalidation"

// Defaults of [Config].
const (
	DefaultPrefix      = "kumiko:cache"
	DefaultCooldown    = time.Second
	DefaultReadTimeout = 250 * time.Millisecond
)

// invalidateTimeout bounds an invalidation's Redis call: the consumer's
// pass (a database transaction) waits for it, and retries it after a
// failure.
const invalidateTimeout = 5 * time.Second

// Config tunes [New]. A nil *Config means the defaults.
type Config struct {
	// Prefix starts every key. Defaults to "kumiko:cache".
	Prefix string
	// Cooldown is how long the cache is bypassed after a Redis error.
	// Defaults to 1s.
	Cooldown time.Duration
	// ReadTimeout bounds the Redis call of a lookup and of a fill: a Redis
	// that does not answer within it counts as failed, the read goes to the
	// database and the cooldown begins. Defaults to 250ms.
	ReadTimeout time.Duration
	// Logger receives Redis failures. Defaults to discarding.
	Logger *slog.Logger
	// Metrics registers kumiko_cache_hits_total, kumiko_cache_misses_total,
	// kumiko_cache_redis_errors_total and kumiko_cache_bypassed_total (each
	// by query) and kumiko_cache_invalidations_total. Defaults to none.
	Metrics prometheus.Registerer
	// Queries are the cached queries whose counters start at 0 (see
	// [framework.Registry.CachedQueries]), so that rate() and increase()
	// see their first Redis error or bypass instead of a series that
	// appears with it. Defaults to none.
	Queries []string
}

// Cache is the Redis entity cache. It is safe for concurrent use.
type Cache struct {
	// cmd sends the cache's commands (autopipelined, see redisauto).
	cmd       *redisauto.Client
	prefix    string
	cooldown  time.Duration
	timeout   time.Duration
	log       *slog.Logger
	downUntil atomic.Int64 // unix nanos until which Redis is bypassed
	held      atomic.Bool  // Redis is bypassed until the guard releases it
	m         metrics
}

type metrics struct {
	hits, misses, errors, bypassed *prometheus.CounterVec
	invalidations                  prometheus.Counter
	heldGauge                      prometheus.Gauge
}

// New returns a cache on rdb. It fails when rdb is nil or the metrics
// cannot be registered.
func New(rdb redis.UniversalClient, cfg *Config) (*Cache, error) {
	if rdb == nil {
		return nil, errors.New("cache: nil redis client")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	c := &Cache{
		cmd:      redisauto.New(rdb),
		prefix:   cmp.Or(cfg.Prefix, DefaultPrefix),
		cooldown: cmp.Or(max(cfg.Cooldown, 0), DefaultCooldown),
		timeout:  cmp.Or(max(cfg.ReadTimeout, 0), DefaultReadTimeout),
		log:      cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
	}
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"query"})
	}
	c.m = metrics{
		hits:     vec("kumiko_cache_hits_total", "Cached query reads answered from Redis."),
		misses:   vec("kumiko_cache_misses_total", "Cached query reads not in Redis, loaded from the database."),
		errors:   vec("kumiko_cache_redis_errors_total", "Cached query reads or fills that failed on Redis and went to the database."),
		bypassed: vec("kumiko_cache_bypassed_total", "Cached query reads sent to the database without asking Redis, during the cooldown after a Redis error or while the invalidations are held up."),
		invalidations: prometheus.NewCounter(prometheus.CounterOpts{Name: "kumiko_cache_invalidations_total",
			Help: "Cached entities invalidated by events."}),
		heldGauge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kumiko_cache_held",
			Help: "1 while the cache guard sends every cached read to the database because an invalidation waits for its retry."}),
	}
	if cfg.Metrics != nil {
		var err error
		for _, p := range []**prometheus.CounterVec{&c.m.hits, &c.m.misses, &c.m.errors, &c.m.bypassed} {
			if *p, err = kmetrics.Register(cfg.Metrics, *p); err != nil {
				return nil, err
			}
		}
		if c.m.invalidations, err = kmetrics.Register(cfg.Metrics, c.m.invalidations); err != nil {
			return nil, err
		}
		if c.m.heldGauge, err = kmetrics.Register(cfg.Metrics, c.m.heldGauge); err != nil {
			return nil, err
		}
	}
	for _, q := range cfg.Queries {
		for _, v := range []*prometheus.CounterVec{c.m.hits, c.m.misses, c.m.errors, c.m.bypassed} {
			v.WithLabelValues(q)
		}
	}
	return c, nil
}

// Key returns the Redis key of one cached entity.
func (c *Cache) Key(tenant, query, key string) string {
	return c.prefix + ":" + url.QueryEscape(tenant) + ":" + url.QueryEscape(query) + ":" + url.QueryEscape(key)
}

// errBypassed is returned by Lookup during the cooldown and while the
// cache is held (see Guard).
var errBypassed = errors.New("cache: bypassed after a redis error")

// Lookup implements [framework.QueryCacheStore].
func (c *Cache) Lookup(ctx context.Context, tenant, query, key string) ([]byte, string, error) {
	if c.held.Load() || time.Now().UnixNano() < c.downUntil.Load() {
		c.m.bypassed.WithLabelValues(query).Inc()
		return nil, "", errBypassed
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	cmd := redis.NewSliceCmd(ctx, "hmget", c.Key(tenant, query, key), "v", "g")
	if err := c.cmd.Do(ctx, cmd); err != nil {
		c.failed(parent, query, "lookup", err)
		return nil, "", fmt.Errorf("cache: lookup: %w", err)
	}
	vals, err := cmd.Result()
	if err != nil {
		c.failed(parent, query, "lookup", err)
		return nil, "", fmt.Errorf("cache: lookup: %w", err)
	}
	g, _ := vals[1].(string)
	if v, ok := vals[0].(string); ok {
		c.m.hits.WithLabelValues(query).Inc()
		return []byte(v), g, nil
	}
	c.m.misses.WithLabelValues(query).Inc()
	return nil, g, nil
}

// fillScript stores the value while the entity's stamp is the one the
// lookup saw. KEYS[1] entity; ARGV stamp, value, ttl ms.
var fillScript = redisauto.NewScript(`
local g = redis.call('HGET', KEYS[1], 'g') or ''
if g ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

// Fill implements [framework.QueryCacheStore].
func (c *Cache) Fill(ctx context.Context, tenant, query, key, stamp string, value []byte, ttl time.Duration) error {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	err := c.cmd.Run(ctx, fillScript, []string{c.Key(tenant, query, key)}, stamp, value, ttlMillis(ttl)).Err()
	if err != nil {
		c.failed(parent, query, "fill", err)
		return fmt.Errorf("cache: fill: %w", err)
	}
	return nil
}

// invalidateScript drops the value and records the stamp. KEYS[1] entity;
// ARGV stamp, ttl ms.
var invalidateScript = redisauto.NewScript(`
redis.call('HDEL', KEYS[1], 'v')
redis.call('HSET', KEYS[1], 'g', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`)

// Invalidate removes the cached entity and sets its stamp (the consistency
// token of the invalidating write, or a later one), so that a fill that
// looked it up before fails. ttl keeps the stamp for as long as a value
// could live. Unlike lookups it ignores the cooldown: an invalidation is
// never skipped.
func (c *Cache) Invalidate(ctx context.Context, tenant, query, key, stamp string, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, invalidateTimeout)
	defer cancel()
	if err := c.cmd.Run(ctx, invalidateScript, []string{c.Key(tenant, query, key)}, stamp, ttlMillis(ttl)).Err(); err != nil {
		return fmt.Errorf("cache: invalidate %s: %w", query, err)
	}
	c.m.invalidations.Inc()
	return nil
}

// failed counts a Redis error and opens the cooldown, unless the caller's
// context (parent) ended: a canceled request or a caller's deadline says
// nothing about Redis.
func (c *Cache) failed(parent context.Context, query, op string, err error) {
	if parent.Err() != nil || errors.Is(err, context.Canceled) {
		return
	}
	c.m.errors.WithLabelValues(query).Inc()
	c.downUntil.Store(time.Now().Add(c.cooldown).UnixNano())
	c.log.Warn("cache redis failed, reading the database", "query", query, "op", op, "error", err)
}

func ttlMillis(d time.Duration) string {
	return strconv.FormatInt(max(d.Milliseconds(), 1), 10)
}

// walPositionSQL reads the primary's WAL insert position: past the commit
// of every event the consumer can see.
const walPositionSQL = `SELECT pg_current_wal_insert_lsn()::text`

// Consumer returns the shared system consumer that invalidates reg's
// cached queries, and false when reg declares none. Run it in the processes
// that run shared consumers (worker and all-in-one).
func (c *Cache) Consumer(reg *framework.Registry) (dispatcher.Consumer, bool) {
	types := reg.CacheEventTypes()
	if len(types) == 0 {
		return dispatcher.Consumer{}, false
	}
	return dispatcher.Consumer{
		Name:       ConsumerName,
		Delivery:   framework.DeliveryShared,
		EventTypes: types,
		System:     true,
		// Redis being down must not kill the consumer: it retries (with
		// the dispatcher's capped backoff) until Redis is back.
		MaxAttempts: math.MaxInt32,
		Apply: func(ctx context.Context, tx *framework.Tx, env framework.Envelope) error {
			keys, err := reg.CacheInvalidations(env)
			if err != nil || len(keys) == 0 {
				return err
			}
			var stamp string
			if err := tx.QueryRow(ctx, walPositionSQL).Scan(&stamp); err != nil {
				return fmt.Errorf("cache: wal position: %w", err)
			}
			for _, k := range keys {
				if err := c.Invalidate(ctx, env.TenantID, k.Query, k.Key, stamp, k.TTL); err != nil {
					return err
				}
			}
			return nil
		},
	}, true
}

// Stats are the cache's counters summed over queries, for tests and tools.
type Stats struct {
	// Hits counts reads answered from Redis.
	Hits float64
	// Misses counts reads loaded from the database (and filled).
	Misses float64
	// RedisErrors counts lookups and fills that failed on Redis.
	RedisErrors float64
	// Bypassed counts reads sent to the database during the cooldown.
	Bypassed float64
	// Invalidations counts entities invalidated by events.
	Invalidations float64
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	return Stats{
		Hits:          sumVec(c.m.hits),
		Misses:        sumVec(c.m.misses),
		RedisErrors:   sumVec(c.m.errors),
		Bypassed:      sumVec(c.m.bypassed),
		Invalidations: value(c.m.invalidations),
	}
}

func sumVec(v *prometheus.CounterVec) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { v.Collect(ch); close(ch) }()
	total := 0.0
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) == nil && d.Counter != nil {
			total += d.Counter.GetValue()
		}
	}
	return total
}

func value(c prometheus.Counter) float64 {
	var d dto.Metric
	if c.Write(&d) != nil || d.Counter == nil {
		return 0
	}
	return d.Counter.GetValue()
}
