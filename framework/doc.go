// Package framework is what a Kumiko feature is written against: the
// registry features declare themselves in, typed events, write and query
// handlers, aggregates, projections, and the runtime that executes them
// against Postgres.
//
// # Features and names
//
// A feature is a package with a Register function that takes a [Registry]
// and calls [Registry.Feature] once. Everything it declares gets a
// persistent, kebab-case name under the feature's: "orders:event:placed",
// "orders:write:place", "orders:query:get". Stored events and consumer
// cursors are keyed by these names, so a shipped name is never renamed.
// Registration mistakes are collected and reported together by
// [Registry.Build], which the process calls at boot.
//
// # Events
//
// [DefineEvent] declares an event with a Go payload type and returns a typed
// handle ([EventType]); its With method builds the event a handler appends,
// and validator tags on the payload are checked on every append. A payload
// change bumps [EventOptions].Version and adds an [Upcaster] from the old
// version; upcasters run on every read.
//
// # Handlers and transactions
//
// [Write] registers a write handler: it runs in one transaction scoped to
// the caller's tenant, writes business rows through [Tx] and appends events
// with [Tx.Append]; rows and events commit together or not at all, and an
// expected stream version that no longer matches fails with a
// [ConcurrencyError]. [Query] registers a query handler, which runs in a
// read-only transaction (on the read pool when one is configured, see
// [ReadRouter]) and may declare a Redis-cached single-entity read with
// [CacheBy]. Row-level security confines every statement of a [Tx] to its
// tenant's rows; handlers carry no tenant condition. Input payloads are
// decoded strictly and validated before a handler runs; a handler reports
// a client error with [Errorf] and an error [Code].
//
// # Aggregates and projections
//
// [NewAggregate] and [Evolve] fold a stream's events into a state, for
// handlers that decide on the history of one stream. [InlineProjection]
// runs in the transaction that appends its events (a write, a job, a saga's
// dispatcher pass); a
// [MultiStreamProjection] runs after commit in a dispatcher pass whose
// transaction also moves its cursor, so its writes and its position commit
// together. [On] adds a projection's handler for one event type.
//
// # Running
//
// [NewRuntime] executes commands and queries against a pgx pool
// ([Runtime.Write], [Runtime.Query]); the entrypoint package builds it, with
// the HTTP surface, the dispatcher and the job lanes, into a process. Tests
// use it directly on a database from the kumikotest package.
package framework
