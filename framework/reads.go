package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ReadRouter chooses the connection a query runs on; framework/replica
// implements it for a streaming replica. Set it with
// [RuntimeConfig].ReadRouter or [Runtime.SetReadRouter].
type ReadRouter interface {
	// AcquireRead returns a connection for a query. With a consistency
	// token ([Runtime.WriteWithToken]) it must return a connection whose
	// server has applied the token's write; with "" any read connection.
	// A token ahead of the primary's WAL position, which no write of this
	// database answered, it may refuse with a bad_request *[Error] whose
	// cause is [ErrConsistencyTokenAhead] instead of waiting for it.
	// A *[Error] it returns reaches the client as is; any other error is
	// answered 503 unavailable.
	AcquireRead(ctx context.Context, token string) (*pgxpool.Conn, error)
}

// ReadFailover is a [ReadRouter] that moves a query to the primary when the
// replica connection it handed out is lost before the query produced its
// result (the replica stopped, restarted or crashed while the query ran,
// or ended the connection after the pool checked it), or when the replica
// cancels the query for a conflict with recovery (a hot standby replaying
// a change that the query's snapshot or locks stand in the way of, past
// max_standby_streaming_delay: SQLSTATE 40001, or 40P01 for a buffer pin
// deadlock). A query is read-only, so the runtime runs it once more, on
// the connection ReplicaLost or ReplicaConflict returns, and the second
// run's result, or error, is the query's. Without it, or when a primary
// connection is lost, the query fails 503 unavailable; a 40001 or 40P01
// of the primary, or of a read server that is not in recovery, stays the
// client's 409 conflict. framework/replica's router implements it.
type ReadFailover interface {
	ReadRouter
	// AcquireReadConn is AcquireRead that also reports whether the
	// connection is a replica's (false: a primary connection).
	AcquireReadConn(ctx context.Context, token string) (conn *pgxpool.Conn, onReplica bool, err error)
	// ReplicaLost is told that a query lost its replica connection with
	// err; it returns a primary connection to run the query once more on.
	ReplicaLost(ctx context.Context, err error) (*pgxpool.Conn, error)
	// ReplicaConflict is told that the replica cancelled a query with err,
	// a conflict with recovery; the replica still works. It returns a
	// primary connection to run the query once more on.
	ReplicaConflict(ctx context.Context, err error) (*pgxpool.Conn, error)
}

// QueryCacheStore keeps the results of cached queries (declared with
// [QueryOptions].Cache); framework/cache implements it on Redis. Set it with
// [RuntimeConfig].QueryCache or [Runtime.SetQueryCache].
//
// Its invalidations come from the event log: a consumer of the events named
// by [InvalidatedBy] removes the entities they change (see
// [Registry.CacheInvalidations]). To keep a fill that raced an invalidation
// from storing an old state, Lookup returns a stamp and Fill stores only
// when the entity's stamp is still the same.
type QueryCacheStore interface {
	// Lookup returns the cached JSON result of (tenant, query, key) (nil
	// on a miss) and the entity's current stamp: the consistency token of
	// its last invalidation ("" when none). On a miss the runtime loads the
	// entity at or after the stamp. An error means the store cannot be
	// used now; the runtime then reads the database and does not fill.
	Lookup(ctx context.Context, tenant, query, key string) (value []byte, stamp string, err error)
	// Fill stores value for ttl unless the entity was invalidated after
	// the Lookup that returned stamp. The runtime does not fill after a
	// load that took half the ttl or longer: the store may keep the stamp
	// of an invalidation for no longer than ttl.
	Fill(ctx context.Context, tenant, query, key, stamp string, value []byte, ttl time.Duration) error
}

// ErrConsistencyTokenAhead is the cause (errors.Is) of the bad_request
// *[Error] a [ReadRouter] returns for a consistency token beyond the
// primary's current WAL position: no write of this database answered it (a
// token is the position right after a commit, and the position only
// grows), so no replica would replay past it before the primary has
// written that much WAL. A write lost in a failover of asynchronous
// replication, or undone by a restore, leaves such tokens too.
var ErrConsistencyTokenAhead = errors.New("kumiko: consistency token ahead of the primary's WAL position")

// ValidConsistencyToken reports whether s has the form of a consistency
// token: a PostgreSQL WAL position "X/Y" with 1 to 8 hex digits on each side.
func ValidConsistencyToken(s string) bool {
	hi, lo, ok := cutByte(s, '/')
	return ok && isHex(hi) && isHex(lo)
}

func cutByte(s string, sep byte) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func isHex(s string) bool {
	if s == "" || len(s) > 8 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'A' <= c && c <= 'F' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// DefaultCacheTTL is the time to live of a cached query result when
// [CacheBy] gets none.
const DefaultCacheTTL = 5 * time.Minute

// QueryCache declares a query a cached single-entity read. Build it with
// [CacheBy] and put it in [QueryOptions].Cache.
type QueryCache struct {
	in            reflect.Type
	key           func(in any) string
	ttl           time.Duration
	invalidations []Invalidation
}

// CacheBy declares a cached single-entity read for a query whose input type
// is In: key names the entity an input reads (for example its id; "" means
// "do not cache this call"), ttl bounds how long a result is kept (zero or
// negative: [DefaultCacheTTL]), and invalidatedBy lists the events that
// change the entity. The cache is keyed by tenant, query and key, so a
// result must depend on nothing else (not on the calling user).
//
// Keys must be canonical: two spellings of one entity (an upper-case and a
// lower-case uuid, which Postgres reads as the same id) must give one key,
// the key the invalidations give, or the entry filled under the other
// spelling is never invalidated and is served stale for ttl. Normalise in
// the key functions (for a uuid, uuid.Parse(id).String()).
//
// Cache only reads of tables written in the write's own transaction (the
// handler's rows, inline projections): invalidations run beside the
// asynchronous projections, not after them, so a read of an asynchronous
// projection's table can be refilled before the projection applied the
// event and serve the old row for ttl.
//
// Without a store ([RuntimeConfig].QueryCache) the declaration changes
// nothing. A query with a different input type, or an invalidation naming
// an event this registry did not declare, is a registration problem.
func CacheBy[In any](ttl time.Duration, key func(in In) string, invalidatedBy ...Invalidation) *QueryCache {
	if ttl <= 0 {
		ttl = DefaultCacheTTL
	}
	c := &QueryCache{in: reflect.TypeFor[In](), ttl: ttl, invalidations: invalidatedBy}
	if key != nil {
		// Not in.(In): an interface In decodes an absent or null payload
		// to the nil interface, which that assertion panics on.
		c.key = func(in any) string { v, _ := in.(In); return key(v) }
	}
	return c
}

// Invalidation says which cached entity an event changes. Build it with
// [InvalidatedBy].
type Invalidation struct {
	def *eventDef
	key func(env Envelope) (string, error)
}

// InvalidatedBy says that events of type ev change the entity key returns
// (the same key the query's [CacheBy] key function gives; "" for none).
func InvalidatedBy[T any](ev EventType[T], key func(e Event[T]) string) Invalidation {
	inv := Invalidation{def: ev.def}
	if key != nil && ev.def != nil {
		def := ev.def
		inv.key = func(env Envelope) (string, error) {
			e, err := decodeEvent[T](def, env)
			if err != nil {
				return "", err
			}
			return key(e), nil
		}
	}
	return inv
}

// cachedQuery is a query's cache declaration, bound to its types.
type cachedQuery struct {
	*QueryCache
	// keyOf returns the entity key of a decoded input.
	keyOf func(in any) string
	// decode turns a cached JSON result into the query's result type.
	decode func(b []byte) (any, error)
}

// bindCache checks c against the query q with input In and output Out.
func bindCache[In, Out any](f *Feature, q string, c *QueryCache) *cachedQuery {
	r := f.reg
	if c.in != reflect.TypeFor[In]() {
		r.problem("query %s: cache key takes %s, the query's input is %s", q, c.in, reflect.TypeFor[In]())
		return nil
	}
	if c.key == nil {
		r.problem("query %s: cache without a key function", q)
		return nil
	}
	for _, inv := range c.invalidations {
		if inv.def == nil || r.events[inv.def.qualified] != inv.def {
			r.problem("query %s: cache invalidated by undeclared event %q", q, inv.def.name())
			return nil
		}
		if inv.key == nil {
			r.problem("query %s: cache invalidation by %s has no key function", q, inv.def.qualified)
			return nil
		}
	}
	return &cachedQuery{
		QueryCache: c,
		keyOf:      c.key,
		decode: func(b []byte) (any, error) {
			var out Out
			if err := json.Unmarshal(b, &out); err != nil {
				return nil, err
			}
			return out, nil
		},
	}
}

// name returns the qualified name, "" for a nil definition.
func (d *eventDef) name() string {
	if d == nil {
		return ""
	}
	return d.qualified
}

// cachedQuery answers a cached query: from the store, else from the
// database (at or after the entity's stamp), filling the store.
func (rt *Runtime) cachedQuery(ctx context.Context, call Call, d *queryDef, in any) (any, error) {
	key := d.cache.keyOf(in)
	if key == "" {
		return rt.query(ctx, call, d, in, "")
	}
	tenant := call.Principal.TenantID
	looked := time.Now()
	value, stamp, lookupErr := rt.cache.Lookup(ctx, tenant, d.qualified, key)
	if lookupErr == nil && value != nil {
		out, err := d.cache.decode(value)
		if err == nil {
			return out, nil
		}
		// A result of an older shape: load and overwrite it.
		rt.logger.Debug("query cache: undecodable entry", "query", d.qualified, "error", err)
	}
	if !ValidConsistencyToken(stamp) {
		stamp = ""
	}
	out, err := rt.query(ctx, call, d, in, stamp)
	if stamp != "" && errors.Is(err, ErrConsistencyTokenAhead) {
		// The invalidation's stamp is ahead of the primary (a failover
		// lost the WAL it was read at, or the database was restored): no
		// client's error, and the primary's state is the newest there is.
		out, err = rt.queryPrimary(ctx, call, d, in)
	}
	if err != nil || lookupErr != nil {
		return out, err
	}
	if time.Since(looked) >= d.cache.ttl/2 {
		// An invalidation's stamp lives one TTL: after a load this slow it
		// may be gone, and the fill could cache the state from before it.
		// Half the TTL leaves the fill time to reach the store.
		return out, nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("kumiko: query %s: encode result for the cache: %w", d.qualified, err)
	}
	if err := rt.cache.Fill(ctx, tenant, d.qualified, key, stamp, b, d.cache.ttl); err != nil {
		rt.logger.Debug("query cache: fill failed", "query", d.qualified, "error", err)
	}
	return out, nil
}

// CacheKey names one cached entity.
type CacheKey struct {
	// Query is the qualified query type.
	Query string
	// Key is the entity's key within the query.
	Key string
	// TTL is the query's cache time to live.
	TTL time.Duration
}

// HasCachedQueries reports whether any query declares a cache.
func (r *Registry) HasCachedQueries() bool {
	for _, d := range r.queries {
		if d.cache != nil {
			return true
		}
	}
	return false
}

// CachedQueries lists, sorted, the qualified types of the queries that
// declare a cache.
func (r *Registry) CachedQueries() []string {
	var out []string
	for _, d := range r.queries {
		if d.cache != nil {
			out = append(out, d.qualified)
		}
	}
	sort.Strings(out)
	return out
}

// CacheEventTypes lists, sorted, the event types that invalidate cached
// query results: the event types a cache invalidation consumer reads.
func (r *Registry) CacheEventTypes() []string {
	seen := map[string]bool{}
	for _, d := range r.queries {
		if d.cache == nil {
			continue
		}
		for _, inv := range d.cache.invalidations {
			seen[inv.def.qualified] = true
		}
	}
	out := make([]string, 0, len(seen))
	for t := range seen {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// CacheInvalidations returns the cached entities env changes (in env's
// tenant), sorted by query. It fails when env's payload cannot be decoded.
func (r *Registry) CacheInvalidations(env Envelope) ([]CacheKey, error) {
	var out []CacheKey
	for _, q := range sortedKeys(r.queries) {
		d := r.queries[q]
		if d.cache == nil {
			continue
		}
		for _, inv := range d.cache.invalidations {
			if inv.def.qualified != env.Type {
				continue
			}
			key, err := inv.key(env)
			if err != nil {
				return nil, err
			}
			if key != "" {
				out = append(out, CacheKey{Query: q, Key: key, TTL: d.cache.ttl})
			}
		}
	}
	return out, nil
}
