package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// DefaultGuardInterval is how often a [Guard] reads the invalidation
// consumer's state.
const DefaultGuardInterval = 500 * time.Millisecond

// guardSQL reads the invalidation consumer's state row: its status and
// whether a failed invalidation waits to be retried.
const guardSQL = `SELECT status, failed_position IS NOT NULL, coalesce(last_error, '')
FROM event_consumers WHERE name = $1 AND instance_id = $2`

// Guard keeps a cache from answering while its invalidations are held up.
// The invalidation consumer usually runs in another process (a worker):
// when it cannot reach Redis (Redis down, restarted with its data, or cut
// off from the worker only), the entries of the entities changed meanwhile
// stay in Redis until the consumer's retry succeeds, up to the
// dispatcher's RetryMaxDelay after Redis is back, and a process that
// reaches Redis would answer with them: a client would see an order go
// back to an older state. The guard reads the consumer's state row every
// interval and, while the row records a failure waiting for its retry (or
// the consumer is disabled, dead or not registered yet), makes every
// lookup bypass Redis and read the database, counted in
// kumiko_cache_bypassed_total; kumiko_cache_held is 1 meanwhile. Entries
// are trusted again once the consumer delivered the failed invalidation.
//
// The cache is held from the guard's creation until its first read of the
// row. A read of the row that fails keeps the previous state.
type Guard struct {
	c        *Cache
	pool     *pgxpool.Pool
	interval time.Duration
	// checked is set by the first read of the row; warned while a hold
	// has been logged as a warning (Run's goroutine only). The hold the
	// guard starts with is not: its release is no news.
	checked, warned bool
	// readFailing is when the reads of the row began to fail (zero: the
	// last one succeeded); readWarned when that was last logged.
	readFailing, readWarned time.Time
}

// guardWarnEvery is how often a guard that cannot read the consumer's
// state says so again.
const guardWarnEvery = time.Minute

// Guard returns a guard of c that reads the invalidation consumer's state
// from pool (the primary) every interval (<= 0: [DefaultGuardInterval]).
// The cache is held until the guard's Run has read the state once.
func (c *Cache) Guard(pool *pgxpool.Pool, interval time.Duration) *Guard {
	if interval <= 0 {
		interval = DefaultGuardInterval
	}
	c.held.Store(true)
	c.m.heldGauge.Set(1)
	return &Guard{c: c, pool: pool, interval: interval}
}

// Held reports whether lookups bypass Redis because the invalidations are
// held up (see [Guard]).
func (c *Cache) Held() bool { return c.held.Load() }

// hold holds or releases the cache: a hold is logged once (with why), a
// release only after a logged hold.
func (g *Guard) hold(held bool, why string) {
	c := g.c
	c.held.Store(held)
	switch {
	case held && !g.warned:
		g.warned = true
		c.m.heldGauge.Set(1)
		c.log.Warn("cache held: reads go to the database until the invalidations catch up", "reason", why)
	case held:
	case g.warned:
		g.warned = false
		c.m.heldGauge.Set(0)
		c.log.Info("cache released: the invalidations caught up")
	default:
		c.m.heldGauge.Set(0)
	}
}

// Run reads the consumer's state every interval until ctx ends; it returns
// nil then.
func (g *Guard) Run(ctx context.Context) error {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		g.check(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// check reads the consumer's state once and holds or releases the cache.
func (g *Guard) check(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(g.interval, time.Second))
	defer cancel()
	var (
		status  string
		failing bool
		lastErr string
	)
	err := g.pool.QueryRow(ctx, guardSQL, ConsumerName, dispatcher.SharedInstance).Scan(&status, &failing, &lastErr)
	if (err == nil || errors.Is(err, pgx.ErrNoRows)) && !g.readFailing.IsZero() {
		g.c.log.Info("cache guard: reads the invalidation consumer's state again", "failed_for", time.Since(g.readFailing).Round(time.Millisecond).String())
		g.readFailing, g.readWarned = time.Time{}, time.Time{}
	}
	switch {
	case errors.Is(err, pgx.ErrNoRows) && !g.checked:
		// At boot the dispatcher of this process may not have registered
		// it yet: no warning for that.
		g.c.log.Info("cache held until a worker has registered the invalidation consumer")
	case errors.Is(err, pgx.ErrNoRows):
		g.hold(true, "the invalidation consumer is not registered: no worker has run it")
	case err != nil:
		if errors.Is(ctx.Err(), context.Canceled) { // shutdown
			return
		}
		// Once, then once a minute: the guard reads every interval for as
		// long as the database is down.
		now := time.Now()
		if g.readFailing.IsZero() {
			g.readFailing = now
		}
		if now.Sub(g.readWarned) >= guardWarnEvery {
			g.readWarned = now
			g.c.log.Warn("cache guard: read the invalidation consumer's state; the cache keeps its state meanwhile",
				"error", err, "failing_for", now.Sub(g.readFailing).Round(time.Millisecond))
		}
		return
	case status == string(dispatcher.StateDisabled) || status == string(dispatcher.StateDead):
		g.hold(true, fmt.Sprintf("the invalidation consumer is %s", status))
	case failing:
		g.hold(true, "an invalidation failed and waits for its retry: "+lastErr)
	default:
		g.hold(false, "")
	}
	g.checked = true
}
