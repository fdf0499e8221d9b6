package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// RuntimeConfig tunes [NewRuntime]. A nil *RuntimeConfig means the defaults.
type RuntimeConfig struct {
	// Logger receives after-commit problems and the queries a replica
	// cancelled for a conflict with recovery. Defaults to discarding.
	Logger *slog.Logger
	// ReadPool runs query handlers (a replica). Defaults to the primary pool.
	ReadPool *pgxpool.Pool
	// OnCommit is called after every commit that wrote events, with their
	// number (the dispatcher's wake-up). Defaults to nothing.
	OnCommit func(events int)
	// ReadRouter picks the connection of every query (a replica, or the
	// primary for a consistency token the replica has not replayed yet).
	// Defaults to ReadPool for queries without a token and the primary for
	// queries with one.
	ReadRouter ReadRouter
	// QueryCache stores the results of queries declared with
	// [QueryOptions].Cache. Defaults to none: such queries always read the
	// database.
	QueryCache QueryCacheStore
}

// Runtime executes write commands, queries and framework work against the
// database, each in its own tenant-scoped transaction.
type Runtime struct {
	reg      *Registry
	pool     *pgxpool.Pool
	readPool *pgxpool.Pool
	logger   *slog.Logger
	onCommit []func(int)
	router   ReadRouter
	cache    QueryCacheStore
	// blocked holds the reason writes are refused (see BlockWrites).
	blocked atomic.Pointer[error]
}

// NewRuntime builds the registry (failing with every registration problem)
// and returns a runtime on pool.
func NewRuntime(reg *Registry, pool *pgxpool.Pool, cfg *RuntimeConfig) (*Runtime, error) {
	if err := reg.Build(); err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = &RuntimeConfig{}
	}
	rt := &Runtime{reg: reg, pool: pool, readPool: cfg.ReadPool, logger: cfg.Logger,
		router: cfg.ReadRouter, cache: cfg.QueryCache}
	if rt.readPool == nil {
		rt.readPool = pool
	}
	if rt.logger == nil {
		rt.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OnCommit != nil {
		rt.onCommit = append(rt.onCommit, cfg.OnCommit)
	}
	return rt, nil
}

// BlockWrites makes every writing transaction of the runtime (Write,
// WriteWithToken, InTx) fail at once with a CodeUnavailable *Error that
// wraps reason, until BlockWrites(nil); queries go on. The entrypoint
// blocks writes while the event log cannot take events safely (its commit
// keys are ahead of the server's transaction ids after a restored dump: an
// event appended then would never be delivered).
func (rt *Runtime) BlockWrites(reason error) {
	if reason == nil {
		rt.blocked.Store(nil)
		return
	}
	rt.blocked.Store(&reason)
}

// WritesBlocked returns the reason given to BlockWrites, or nil.
func (rt *Runtime) WritesBlocked() error {
	if p := rt.blocked.Load(); p != nil {
		return *p
	}
	return nil
}

// Registry returns the runtime's registry.
func (rt *Runtime) Registry() *Registry { return rt.reg }

// Pool returns the primary pool.
func (rt *Runtime) Pool() *pgxpool.Pool { return rt.pool }

// OnCommit adds a function called after every commit that wrote events, in
// the order added; a panic of one is logged and does not fail the write.
// Call it before the runtime serves requests.
func (rt *Runtime) OnCommit(fn func(events int)) { rt.onCommit = append(rt.onCommit, fn) }

// SetReadRouter sets [RuntimeConfig].ReadRouter. Call it before the runtime
// serves requests.
func (rt *Runtime) SetReadRouter(r ReadRouter) { rt.router = r }

// SetQueryCache sets [RuntimeConfig].QueryCache. Call it before the runtime
// serves requests.
func (rt *Runtime) SetQueryCache(c QueryCacheStore) { rt.cache = c }

// Call describes who runs a command and why.
type Call struct {
	// Principal is the authenticated caller; its TenantID scopes the
	// transaction.
	Principal Principal
	// RequestID is the HTTP request id.
	RequestID string
	// CorrelationID defaults to RequestID.
	CorrelationID string
	// CausationID defaults to RequestID.
	CausationID string
	// IdempotencyKey is recorded in the metadata of appended events.
	IdempotencyKey string
	// IdempotencyOwner is the owner token of the idempotency claim the
	// call runs under, recorded beside the key.
	IdempotencyOwner string
	// IdempotencyReclaimedFrom is the owner whose claim ran out before this
	// call's owner took the key over, recorded beside the key.
	IdempotencyReclaimedFrom string
	// IdempotencyLeaseUntil is when the claim of IdempotencyKey may end at
	// the earliest (its lease, less a margin for clock offsets): no other
	// owner can take the key over before it. When set, a write checks
	// before its COMMIT, under the key's advisory lock (see
	// [Runtime.KeyedEvents]), that no other owner committed events with the
	// key since then; if one did (this owner's lease ran out while it still
	// ran, and the owner that took the key over ran the write), nothing is
	// committed and the write fails with CodeConflict.
	IdempotencyLeaseUntil time.Time
	// IdempotencyReclaimedSince is, for a call whose owner took the key
	// over (IdempotencyReclaimedFrom is set), when the key was first
	// claimed, at the earliest (zero: any time). The previous owner may
	// still run and commit the write after this owner found nothing of it
	// (it had not yet begun its transaction, so the check did not wait for
	// it): such a write checks before its COMMIT, under the key's advisory
	// lock, that no other owner committed events with the key since then;
	// if one did, nothing is committed and the write fails with
	// CodeConflict. A fresh claim (no previous owner) runs no such check.
	IdempotencyReclaimedSince time.Time
	// ConsistencyToken is the token of an earlier write (see
	// [Runtime.WriteWithToken]); a query that carries one reads that write
	// or a later state, and skips the query cache.
	ConsistencyToken string
}

func (c Call) metadata() Metadata {
	corr := c.CorrelationID
	if corr == "" {
		corr = c.RequestID
	}
	cause := c.CausationID
	if cause == "" {
		cause = c.RequestID
	}
	return Metadata{UserID: c.Principal.UserID, RequestID: c.RequestID, CorrelationID: corr, CausationID: cause,
		IdempotencyKey: c.IdempotencyKey, IdempotencyOwner: c.IdempotencyOwner, IdempotencyReclaimedFrom: c.IdempotencyReclaimedFrom}
}

// Command is one write or query: a qualified type and its JSON payload.
type Command struct {
	// Type is "<feature>:write:<name>" or "<feature>:query:<name>".
	Type string `json:"type"`
	// Payload is the handler's input.
	Payload json.RawMessage `json:"payload"`
}

// BatchError reports which command of a batch failed; nothing of the batch
// persisted.
type BatchError struct {
	// Index is the failed command's position in the batch (0-based).
	Index int
	// Err is the command's error.
	Err error
}

// Error implements error.
func (e *BatchError) Error() string { return fmt.Sprintf("command %d: %v", e.Index, e.Err) }

// Unwrap returns the command's error.
func (e *BatchError) Unwrap() error { return e.Err }

// unknownType is the 404 for a type nobody registered, with a hint. It
// repeats (and scores for the hint) an [Excerpt] of the type: a client's
// megabyte of type name is not echoed.
func unknownType(kind, typ string, known []string) *Error {
	typ = Excerpt(typ)
	return &Error{
		Code:    CodeNotFound,
		Message: fmt.Sprintf("unknown %s type %q", kind, typ),
		Details: map[string]any{"knownTypes": closestNames(typ, known, 10)},
	}
}

// checkRoles returns access_denied unless p has every role.
func checkRoles(p Principal, roles []string, typ string) error {
	if len(roles) > 0 && !p.HasAllRoles(roles) {
		return &Error{Code: CodeAccessDenied, Message: fmt.Sprintf("%s requires the roles %s", typ, strings.Join(roles, ", "))}
	}
	return nil
}

// Write runs the commands in one transaction of the caller's tenant: all
// of them commit, or none. With several commands a failure is a
// *[BatchError] naming the index. It returns each command's result.
func (rt *Runtime) Write(ctx context.Context, call Call, cmds []Command) ([]any, error) {
	out, _, err := rt.write(ctx, call, cmds, false)
	return out, err
}

// WriteWithToken is [Runtime.Write] that also returns the commit's
// consistency token: the primary's WAL insert position read on the same
// connection right after the COMMIT (pipelined with it, no extra round
// trip), so it is at or after the commit record. A query whose
// [Call].ConsistencyToken carries it sees this write.
func (rt *Runtime) WriteWithToken(ctx context.Context, call Call, cmds []Command) ([]any, string, error) {
	return rt.write(ctx, call, cmds, true)
}

func (rt *Runtime) write(ctx context.Context, call Call, cmds []Command, withToken bool) ([]any, string, error) {
	defs := make([]*writeDef, len(cmds))
	for i, c := range cmds {
		d := rt.reg.writes[c.Type]
		if d == nil {
			return nil, "", rt.batchErr(len(cmds), i, unknownType("write", c.Type, rt.reg.WriteTypes()))
		}
		if err := checkRoles(call.Principal, d.roles, c.Type); err != nil {
			return nil, "", rt.batchErr(len(cmds), i, err)
		}
		defs[i] = d
	}
	if call.Principal.TenantID == "" {
		return nil, "", &Error{Code: CodeUnauthorized, Message: "no tenant"}
	}
	var token *string
	if withToken {
		token = new(string)
	}
	results := make([]any, len(cmds))
	var afters []func(context.Context)
	var wtx *Tx
	// The commands' appends stay buffered (unless a command needs them
	// written: inline projections, PostSave, a read) and are written
	// together, in stream order, with the COMMIT: batches appending to the
	// same streams in different command orders then lock them in one order
	// and cannot deadlock. Each append remembers its command, so a failed
	// append (a version conflict) is still attributed to it.
	_, err := rt.inTx(ctx, call.Principal.TenantID, call.Principal, call.metadata(), token, call.keyedGuard(), func(ctx context.Context, tx *Tx) error {
		wtx = tx
		for i, c := range cmds {
			tx.cmd = i
			out, after, err := defs[i].run(ctx, tx, c.Payload)
			if err == nil && (defs[i].post != nil || tx.needsFlush()) {
				// Writes the events and runs their inline projections.
				_, err = tx.Flush(ctx)
				if err == nil && defs[i].post != nil {
					err = defs[i].post(ctx, tx, c.Payload, out)
				}
			}
			if err != nil {
				if j, ok := tx.failedCommand(); ok {
					// An earlier command's buffered append, written now.
					i = j
				}
				return rt.batchErr(len(cmds), i, err)
			}
			results[i] = out
			if after != nil {
				afters = append(afters, after)
			}
		}
		return nil
	})
	if err != nil {
		// A write whose outcome is unknown failed as a whole, at its
		// COMMIT: no command is to blame.
		if _, ok := errors.AsType[*BatchError](err); !ok && len(cmds) > 1 && wtx != nil && !errors.Is(err, ErrCommitOutcomeUnknown) {
			if j, ok := wtx.failedCommand(); ok {
				// An append written with the COMMIT failed.
				err = &BatchError{Index: j, Err: err}
			}
		}
		return nil, "", err
	}
	for _, a := range afters {
		rt.afterCommit(call.RequestID, "AfterCommit", func() { a(ctx) })
	}
	if token == nil {
		return results, "", nil
	}
	return results, *token, nil
}

func (rt *Runtime) batchErr(n, i int, err error) error {
	if n == 1 {
		return err
	}
	return &BatchError{Index: i, Err: err}
}

// Query runs a query handler in a read-only transaction of the caller's
// tenant on the read pool (see [RuntimeConfig].ReadRouter). A query
// declared with [QueryOptions].Cache is answered from the query cache when
// it holds the entity, and fills it otherwise; a call with a
// ConsistencyToken skips the cache and reads at or after the token's write,
// and so does a call of [SystemTenantID] (invalidations name the tenant of
// the event, never the system tenant).
// A malformed token is a bad_request *[Error], and so is one the router
// finds ahead of the primary ([ErrConsistencyTokenAhead]).
func (rt *Runtime) Query(ctx context.Context, call Call, cmd Command) (any, error) {
	d := rt.reg.queries[cmd.Type]
	if d == nil {
		return nil, unknownType("query", cmd.Type, rt.reg.QueryTypes())
	}
	if err := checkRoles(call.Principal, d.roles, cmd.Type); err != nil {
		return nil, err
	}
	if call.Principal.TenantID == "" {
		return nil, &Error{Code: CodeUnauthorized, Message: "no tenant"}
	}
	if call.ConsistencyToken != "" && !ValidConsistencyToken(call.ConsistencyToken) {
		return nil, &Error{Code: CodeBadRequest, Message: "malformed consistency token: send back the token of a write response unchanged"}
	}
	// Decoded before a connection is taken: a bad payload waits for no
	// replica and holds no connection.
	in, err := d.decode(cmd.Payload)
	if err != nil {
		return nil, err
	}
	// The system tenant's reads span every tenant while invalidations name
	// the event's tenant: an entry of the system tenant would never be
	// invalidated, so its reads skip the cache.
	if d.cache != nil && rt.cache != nil && call.ConsistencyToken == "" && call.Principal.TenantID != SystemTenantID {
		return rt.cachedQuery(ctx, call, d, in)
	}
	return rt.query(ctx, call, d, in, call.ConsistencyToken)
}

// query runs d with the decoded input in on a read connection for token. A
// query that lost its replica connection, or that the replica cancelled
// for a conflict with recovery, runs once more on the primary (see
// [ReadFailover]).
func (rt *Runtime) query(ctx context.Context, call Call, d *queryDef, in any, token string) (any, error) {
	conn, onReplica, err := rt.acquireRead(ctx, token)
	if err != nil {
		return nil, err
	}
	out, err := rt.queryOn(ctx, conn, call, d, in)
	if err == nil || !onReplica {
		conn.Release()
		return out, err
	}
	var failover func(context.Context, error) (*pgxpool.Conn, error)
	switch {
	case queryConnLost(ctx, conn, err):
		failover = rt.router.(ReadFailover).ReplicaLost
	case recoveryConflict(ctx, conn, err):
		rt.logger.Warn("replica cancelled a query for a conflict with recovery, it runs on the primary",
			"query", d.qualified, "request_id", call.RequestID, "error", err, "detail", pgErrorDetail(err))
		failover = rt.router.(ReadFailover).ReplicaConflict
	default:
		conn.Release()
		return out, err
	}
	conn.Release()
	conn, ferr := failover(ctx, err)
	if ferr != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: ferr}
	}
	defer conn.Release()
	return rt.queryOn(ctx, conn, call, d, in)
}

// queryPrimary runs d with the decoded input in on the primary.
func (rt *Runtime) queryPrimary(ctx context.Context, call Call, d *queryDef, in any) (any, error) {
	conn, err := rt.pool.Acquire(ctx)
	if err != nil {
		return nil, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: err}
	}
	defer conn.Release()
	return rt.queryOn(ctx, conn, call, d, in)
}

// queryConnLost reports whether a query failed with err because its
// connection was lost, not because of the query or its context.
func queryConnLost(ctx context.Context, conn *pgxpool.Conn, err error) bool {
	return ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) &&
		connectionLost(conn.Conn(), err)
}

// recoveryConflict reports whether a query failed with err, on the
// replica connection conn, because the server cancelled it for a conflict
// with recovery: a 40001 (snapshot, lock, tablespace) or 40P01 (buffer pin
// deadlock) from a server in recovery. Postgres gives these conflicts no
// SQLSTATE of their own, and its message may be translated; but a hot
// standby refuses serializable transactions, so a read there sees another
// 40001 or 40P01 only when it makes one itself (a function raising it, a
// deadlock over advisory locks), which runs once more on the primary
// harmlessly. A server that is not in recovery (a promoted standby, a
// primary as read server) has no recovery to conflict with: its 40001 is a
// real one and stays the client's. The check costs a round trip on the
// failed query's connection, whose transaction has ended, and only then.
func recoveryConflict(ctx context.Context, conn *pgxpool.Conn, err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok || (pgErr.Code != "40001" && pgErr.Code != "40P01") || ctx.Err() != nil {
		return false
	}
	var inRecovery bool
	return conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery) == nil && inRecovery
}

// pgErrorDetail returns the DETAIL of the Postgres error in err's chain
// (for a conflict with recovery, which kind it was), "" for none.
func pgErrorDetail(err error) string {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return pgErr.Detail
	}
	return ""
}

// queryOn runs d with the decoded input in on conn, in a read-only
// transaction.
func (rt *Runtime) queryOn(ctx context.Context, conn *pgxpool.Conn, call Call, d *queryDef, in any) (any, error) {
	var out any
	_, err := rt.runOn(ctx, conn, call.Principal.TenantID, call.Principal, call.metadata(), true, nil, keyedGuard{}, func(ctx context.Context, tx *Tx) error {
		var err error
		out, err = d.run(ctx, tx, in)
		return err
	})
	return out, err
}

// acquireRead returns the connection a query with token runs on, and
// whether a [ReadFailover] router took it from the replica.
func (rt *Runtime) acquireRead(ctx context.Context, token string) (*pgxpool.Conn, bool, error) {
	if rt.router != nil {
		var conn *pgxpool.Conn
		var onReplica bool
		var err error
		if f, ok := rt.router.(ReadFailover); ok {
			conn, onReplica, err = f.AcquireReadConn(ctx, token)
		} else {
			conn, err = rt.router.AcquireRead(ctx, token)
		}
		if err != nil {
			var fe *Error
			if errors.As(err, &fe) {
				return nil, false, err
			}
			return nil, false, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: err}
		}
		return conn, onReplica, nil
	}
	pool := rt.readPool
	if token != "" {
		// Without a router nobody knows how far a replica is: the
		// primary has every write.
		pool = rt.pool
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, false, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: err}
	}
	return conn, false, nil
}

// InTx runs fn in a transaction scoped to tenant (SystemTenantID: all
// tenants) with the given metadata, writes its buffered events (running
// inline projections) and commits. It returns the number of events written.
func (rt *Runtime) InTx(ctx context.Context, tenant string, meta Metadata, fn func(ctx context.Context, tx *Tx) error) (int, error) {
	return rt.inTx(ctx, tenant, Principal{UserID: meta.UserID, TenantID: tenant}, meta, nil, keyedGuard{}, fn)
}

// inTx runs fn in a writing transaction on the primary; a non-nil token
// receives the commit's consistency token. guard guards a keyed write's
// COMMIT (see [keyedGuard]).
func (rt *Runtime) inTx(ctx context.Context, tenant string, p Principal, meta Metadata, token *string, guard keyedGuard, fn func(ctx context.Context, tx *Tx) error) (int, error) {
	if reason := rt.WritesBlocked(); reason != nil {
		return 0, &Error{Code: CodeUnavailable, Message: "writes are paused until an operator repairs the database (see the server log)", Err: reason}
	}
	conn, err := rt.pool.Acquire(ctx)
	if err != nil {
		return 0, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: err}
	}
	defer conn.Release()
	return rt.runOn(ctx, conn, tenant, p, meta, false, token, guard, func(ctx context.Context, tx *Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if tx.needsFlush() {
			_, err := tx.Flush(ctx)
			return err
		}
		return nil
	})
}

// runOn begins a scoped transaction on conn, runs fn and commits,
// pipelining buffered appends with the COMMIT. A non-nil token receives the
// WAL insert position read right after the COMMIT in the same pipeline.
// guard may queue the check of a keyed write's claim before the COMMIT
// (see [keyedGuard]).
func (rt *Runtime) runOn(ctx context.Context, conn *pgxpool.Conn, tenant string, p Principal, meta Metadata, readOnly bool, token *string, guard keyedGuard, fn func(ctx context.Context, tx *Tx) error) (int, error) {
	// BEGIN and the tenant scope travel with the transaction's first
	// statement (or with the COMMIT batch): one round trip less.
	opts := tenancy.Options{ReadOnly: readOnly}
	if !readOnly && meta.IdempotencyKey != "" {
		// Held until this transaction ends, also when the process that
		// sent it died: see KeyedEvents.
		opts.Lock = keyedLockKey(tenant, meta.UserID, meta.IdempotencyKey)
	}
	lz, err := tenancy.BeginLazy(conn.Conn(), tenant, opts)
	if err != nil {
		return 0, err
	}
	tx := newTx(lz, rt.reg, tenant, p, meta, readOnly)
	// A Tx kept past fn must not reach the connection once it is released.
	defer tx.end()
	if err := fn(ctx, tx); err != nil {
		if lz.Begun() {
			rollback(conn.Conn())
		}
		// No COMMIT was sent: whatever ended the connection, nothing of
		// the transaction committed, and a retry is safe.
		return 0, unavailableIfLost(ctx, conn.Conn(), err)
	}
	b := &pgx.Batch{}
	if err := tx.queueFlush(b); err != nil {
		if lz.Begun() {
			rollback(conn.Conn())
		}
		return 0, err
	}
	takenOver := false
	if !readOnly && meta.IdempotencyKey != "" {
		if since, ok := guard.since(meta, time.Now()); ok {
			queueKeyedGuard(b, tenant, meta, since, &takenOver)
		}
	}
	committed := false
	b.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error {
		if ct.String() != "COMMIT" {
			// A statement of the transaction failed and fn went on:
			// PostgreSQL answers the COMMIT of an aborted transaction
			// with ROLLBACK, and no error.
			return errAbortedCommit
		}
		committed = true
		return nil
	})
	if token != nil {
		// After a successful COMMIT, in a new implicit transaction; a
		// failed COMMIT skips it. The insert position is past the commit
		// record whatever synchronous_commit is.
		b.Queue(walPositionSQL).QueryRow(func(r pgx.Row) error { return r.Scan(token) })
	}
	if err := lz.SendBatch(ctx, b).Close(); err != nil {
		if !committed {
			rollback(conn.Conn())
			if takenOver {
				return 0, errKeyTakenOver(meta)
			}
			if endedBeforeCommit(err) || readOnly {
				// The server ended the connection with an error before the
				// COMMIT completed: it did not commit. A read-only
				// transaction (a query) has nothing to commit: whatever
				// its COMMIT's fate, a retry is safe.
				return 0, unavailableIfLost(ctx, conn.Conn(), err)
			}
			// A connection lost otherwise after the batch went out (pgx
			// does not say reliably whether it left: a failed read makes
			// its later errors claim so) leaves the outcome unknown: not
			// 503, which says nothing committed (a keyed write's claim is
			// released for a retry, which would run the write again).
			if ctx.Err() != nil || connectionLost(conn.Conn(), err) {
				return 0, &Error{Code: CodeInternal, Message: commitOutcomeUnknownMessage,
					Err: fmt.Errorf("%w: %w", ErrCommitOutcomeUnknown, err)}
			}
			return 0, err
		}
		// The write committed; what failed came after the COMMIT's
		// answer (the token's query, or the end of the batch on a lost
		// connection). Only a token can be missing: a query without one
		// still runs, it may just not see this write on a replica.
		if token != nil {
			rt.logger.Warn("consistency token unavailable", "request_id", meta.RequestID, "error", err)
			*token = ""
		}
	}
	if tx.written > 0 {
		for _, f := range rt.onCommit {
			rt.afterCommit(meta.RequestID, "OnCommit", func() { f(tx.written) })
		}
	}
	return tx.written, nil
}

// afterCommit runs a hook of a committed transaction. The write cannot be
// undone any more: a panic of the hook is logged, not propagated, so that
// the caller still learns that the write committed (a 500 would be
// retried, writing twice) and the other hooks still run.
func (rt *Runtime) afterCommit(requestID, hook string, fn func()) {
	defer func() {
		if v := recover(); v != nil {
			rt.logger.Error("hook panicked after commit", "hook", hook, "request_id", requestID,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		}
	}()
	fn()
}

// rollback ends a failed transaction; a connection that cannot is
// discarded by the pool on release (it is not idle).
func rollback(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil && !errors.Is(err, context.Canceled) {
		_ = c.Close(ctx)
	}
}

// unavailableIfLost returns err, which ended a transaction on c that did
// not commit (its COMMIT was not sent, or the server ended the connection
// before it completed, or it was read-only), as a CodeUnavailable *[Error]
// when it means the database connection is gone: the server ended it
// (57P01 admin shutdown, as in a restart's fast shutdown; 57P02 crash
// shutdown; 57P03 cannot connect now; class 08, connection exception; any
// other FATAL, such as an idle-in-transaction session timeout), or the
// driver closed it on a network failure or when a statement's own context
// ended (a handler that bounds a statement with a deadline: the message
// says so). An error with a code of its own (a handler's *Error, a
// validation or concurrency error, a translated constraint violation)
// stays, and so does one of a ctx that ended, which closes the connection
// too.
func unavailableIfLost(ctx context.Context, c *pgx.Conn, err error) error {
	if ctx.Err() != nil || ToError(err).Code != CodeInternal || !connectionLost(c, err) {
		return err
	}
	msg := "database unavailable"
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		msg = statementDeadlineMessage
	case errors.Is(err, context.Canceled):
		msg = statementCancelledMessage
	}
	if be, ok := errors.AsType[*BatchError](err); ok {
		// ToError reads a *BatchError first, wherever it sits in the
		// chain: the command's error itself must say unavailable.
		return &BatchError{Index: be.Index, Err: &Error{Code: CodeUnavailable, Message: msg, Err: be.Err}}
	}
	return &Error{Code: CodeUnavailable, Message: msg, Err: err}
}

// statementDeadlineMessage and statementCancelledMessage answer a
// transaction whose statement ran on a context of the handler's own that
// ended first (its deadline, or the handler cancelled it): the driver
// closed the connection, so nothing was committed.
const (
	statementDeadlineMessage  = "a database statement ran past its handler's deadline; nothing was committed"
	statementCancelledMessage = "a database statement was cancelled by its handler; nothing was committed"
)

// connectionLost reports whether err, which a statement on c failed with,
// means that the connection is gone (see unavailableIfLost) rather than
// that the server refused the statement.
func connectionLost(c *pgx.Conn, err error) bool {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return sessionEnded(pgErr)
	}
	if encodeFailed(err) {
		return false
	}
	return c.IsClosed()
}

// encodeFailed reports whether err is pgx's refusal to encode an argument
// of a pipelined statement (a value out of its parameter's range, say):
// pgx closes the connection then, though nothing was sent and the server
// is fine. Its ErrPreprocessingBatch keeps the step unexported; "build" is
// the client-side encoding (the other step, "prepare", is the server's).
func encodeFailed(err error) bool {
	pe, ok := errors.AsType[pgx.ErrPreprocessingBatch](err)
	return ok && strings.HasPrefix(pe.Error(), "error preprocessing batch (build)")
}

// sessionEnded reports whether the server's error ended the session: 57P01
// admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now, class 08
// (connection exception), or any other FATAL or PANIC, with the server's
// own reason (an idle or idle-in-transaction session timeout, say); the
// driver closes the connection on it. Any other error means the server
// answered the statement: its connection works.
func sessionEnded(pgErr *pgconn.PgError) bool {
	switch {
	case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03", strings.HasPrefix(pgErr.Code, "08"):
		return true
	default:
		return pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC"
	}
}

// loginRefused reports whether the server's error refused a connect for the
// client's own configuration: class 28 (invalid authorization: a wrong
// password, no pg_hba entry, a role that does not exist), 3D000 (the
// database does not exist) or 42501 (no CONNECT privilege). The server
// sends them as FATAL, but it is up: the failure lasts until the
// configuration changes.
func loginRefused(pgErr *pgconn.PgError) bool {
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000" || pgErr.Code == "42501"
}

// DatabaseUnreachable reports whether err says that the database could not
// be reached or ended the connection: a refused, failed or timed-out
// connect, a network failure, a connection the driver had closed, or the
// server's own FATAL (a restart's shutdown, a crash, a session timeout).
// Such a failure passes when the database is back; background loops retry
// it and log it as a warning. A context that ended is not one (outside a
// connect), nor is an error the server answered a statement with, nor a
// connect the server refused for the client's configuration (see
// loginRefused), nor a connection used by two statements at once (pgx's
// "conn busy", a bug of the code sharing it).
func DatabaseUnreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		return sessionEnded(pgErr) && !loginRefused(pgErr)
	}
	if _, ok := errors.AsType[*pgconn.ConnectError](err); ok {
		// Also a connect that timed out (a host that does not answer),
		// which wraps context.DeadlineExceeded.
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	// Not pgconn.SafeToRetry: it also holds for "conn busy", which says
	// nothing about the database.
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, pgconn.ErrConnClosed)
}

// endedBeforeCommit reports whether err, the failure of a batch ending in
// COMMIT whose COMMIT did not complete, is the server's own FATAL error
// ending the connection (57P01 admin shutdown, 57P03 cannot connect now,
// class 08): the server reports it instead of running (or before
// finishing) the statement it was at, so the COMMIT did not run. A backend
// that died otherwise (killed, or the immediate shutdown that sends only a
// notice) may have committed before its answers left.
func endedBeforeCommit(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Severity == "FATAL" && (pgErr.Code == "57P01" || pgErr.Code == "57P03" || strings.HasPrefix(pgErr.Code, "08"))
}

// ErrCommitOutcomeUnknown is wrapped by the error of a write whose
// database connection was lost (or whose context ended) after its COMMIT
// was sent and before the answer came: the write may or may not have
// committed. The client gets a 500 internal saying so; the idempotency
// middleware neither stores that answer nor frees the key, so that a retry
// with the key, once the claim's lease ran out, looks for the write's
// events first and runs it only when there are none.
var ErrCommitOutcomeUnknown = errors.New("kumiko: the database connection was lost after COMMIT was sent")

// commitOutcomeUnknownMessage is what the client of such a write reads.
const commitOutcomeUnknownMessage = "the database connection was lost while the write was committing: " +
	"whether it committed is unknown; read before you write again"

// errAbortedCommit is returned when COMMIT rolled back an aborted transaction.
var errAbortedCommit = errors.New("kumiko: the transaction was rolled back at COMMIT: a statement in it failed and the handler ignored the error")

// walPositionSQL reads the primary's current WAL insert position.
const walPositionSQL = `SELECT pg_current_wal_insert_lsn()::text`

// rollbackTimeout bounds the ROLLBACK of a failed transaction.
const rollbackTimeout = 5 * time.Second
