// Package cache is Kumiko's entity cache on Redis: the
// [framework.QueryCacheStore] behind queries declared with
// [framework.CacheBy], and the shared system consumer that invalidates it
// from the event log.
//
// # Layout
//
// One Redis hash per cached entity, at
// "<prefix>:<tenant>:<query>:<key>" (each part query-escaped, so ':' inside
// a part cannot collide), with the fields v (the JSON result) and g (the
// consistency token of the entity's last invalidation). The hash expires
// after the query's TTL.
//
// # Reads
//
// A hit is one HMGET. A miss loads from the database, at or after the
// entity's g (so a replica that has not replayed the invalidating write
// yet is not used for the fill), and fills with a script that stores v
// only while g is unchanged: a fill that raced an invalidation is dropped
// instead of caching the old state. g expires with the hash, so the runtime
// does not fill after a load that took half the TTL or longer. Queries that carry a consistency token
// skip the cache (the runtime decides that).
//
// # Invalidation
//
// [Cache.Consumer] returns system:consumer:cache-invalidation, a shared
// system consumer of every event type named by [framework.InvalidatedBy].
// For each event it reads the primary's WAL position (which is past the
// event's commit), then deletes v and sets g to that position for every
// entity the event changes. A Redis failure fails the event; the
// dispatcher retries it (the consumer never turns dead), so no
// invalidation is lost while Redis is down.
//
// # Redis down
//
// A failed lookup or fill counts in kumiko_cache_redis_errors_total and
// the query reads the database. After an error the cache is bypassed for
// [Config].Cooldown (default 1 s; kumiko_cache_bypassed_total counts those
// reads), so an unreachable Redis does not add its timeout to every read.
//
// # Held invalidations
//
// An invalidation that failed leaves the old entries in Redis until the
// consumer's retry succeeds. A [Guard], run by the processes that serve
// queries, reads the consumer's state row and bypasses Redis while it
// records such a failure (kumiko_cache_held is 1 meanwhile).
package cache
