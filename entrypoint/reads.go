package entrypoint

import (
	"context"
	"fmt"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/cache"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/framework/replica"
)

// appReads is what a process adds for reads and idempotent writes: the
// replica router, the entity cache and the idempotency store.
type appReads struct {
	router *replica.Router
	cache  *cache.Cache
	// guard holds the cache while an invalidation waits for its retry
	// (api and all-in-one; nil otherwise).
	guard *cache.Guard
	idem  *idempotency.Store
}

// setupReads wires the read side and idempotent writes into the runtime
// and returns consumers with the ones this mode runs added:
//
//   - DATABASE_READ_URL set: queries run on the read pool through a
//     [replica.Router] (consistency tokens wait for the replica, else run on
//     the primary). Writes, the dispatcher and jobs keep the primary.
//   - a query declared with a cache: the Redis entity cache serves it, and
//     the shared system consumer system:consumer:cache-invalidation runs in
//     the modes that run shared consumers (worker, all-in-one). Processes
//     that serve queries (api, all-in-one) run a [cache.Guard] when some
//     event invalidates a cached query: reads go to the database while
//     that consumer's row records a failed invalidation.
//   - api and all-in-one: the idempotency store of POST /api/write and
//     /api/batch (installed on the HTTP server with [App.idempotency]).
func (a *App) setupReads(consumers []dispatcher.Consumer) ([]dispatcher.Consumer, error) {
	a.reads = &appReads{}
	if a.readPool != nil {
		r, err := replica.New(a.pool, a.readPool, &replica.Config{Logger: a.log, Metrics: a.metrics, WaitTimeout: a.cfg.ReplicaWait})
		if err != nil {
			return nil, fmt.Errorf("entrypoint: %w", err)
		}
		a.reads.router = r
		a.rt.SetReadRouter(r)
	}
	if a.reg.HasCachedQueries() {
		c, err := cache.New(a.redis, &cache.Config{Logger: a.log, Metrics: a.metrics, Queries: a.reg.CachedQueries()})
		if err != nil {
			return nil, fmt.Errorf("entrypoint: %w", err)
		}
		a.reads.cache = c
		a.rt.SetQueryCache(c)
		cons, ok := c.Consumer(a.reg)
		if ok && a.runs(framework.RunInWorker, cons.Delivery) {
			consumers = append(consumers, cons)
		}
		// Without an invalidating event (TTL-only caches) there is no
		// consumer, no state row, and nothing to hold: a guard would hold
		// the cache for good. A worker guards its cache too: Go code in
		// it (a job) may run cached queries.
		if ok {
			a.reads.guard = c.Guard(a.pool, 0)
		}
	}
	if a.mode != config.ModeWorker {
		s, err := idempotency.New(a.redis, &idempotency.Config{Logger: a.log, Metrics: a.metrics, TTL: a.cfg.IdempotencyTTL})
		if err != nil {
			return nil, fmt.Errorf("entrypoint: %w", err)
		}
		a.reads.idem = s
		// After the HTTP server stopped: the responses still being stored.
		a.onShutdown(s.Close)
	}
	return consumers, nil
}

// runCacheGuard runs the cache guard, if this process has one, until ctx
// ends.
func (a *App) runCacheGuard(ctx context.Context) {
	if a.reads != nil && a.reads.guard != nil {
		_ = a.reads.guard.Run(ctx)
	}
}

// idempotency returns the idempotency store for the HTTP server (nil before
// setupReads and in worker mode).
func (a *App) idempotency() *idempotency.Store {
	if a.reads == nil {
		return nil
	}
	return a.reads.idem
}
