package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// RuntimeConfig tunes [NewRuntime]. A nil *RuntimeConfig means the defaults.
type RuntimeConfig struct {
	// Logger receives after-commit problems. Defaults to discarding.
	Logger *slog.Logger
	// ReadPool runs query handlers (a replica). Defaults to the primary pool.
	ReadPool *pgxpool.Pool
	// OnCommit is called after every commit that wrote events, with their
	// number (the dispatcher's wake-up). Defaults to nothing.
	OnCommit func(events int)
}

// Runtime executes write commands, queries and framework work against the
// database, each in its own tenant-scoped transaction.
type Runtime struct {
	reg      *Registry
	pool     *pgxpool.Pool
	readPool *pgxpool.Pool
	logger   *slog.Logger
	onCommit []func(int)
	inline   map[string][]*Projection
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
	rt := &Runtime{reg: reg, pool: pool, readPool: cfg.ReadPool, logger: cfg.Logger, inline: map[string][]*Projection{}}
	if rt.readPool == nil {
		rt.readPool = pool
	}
	if rt.logger == nil {
		rt.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OnCommit != nil {
		rt.onCommit = append(rt.onCommit, cfg.OnCommit)
	}
	for _, p := range reg.Projections() {
		if p.kind == KindInline {
			for _, t := range p.types {
				rt.inline[t] = append(rt.inline[t], p)
			}
		}
	}
	return rt, nil
}

// Registry returns the runtime's registry.
func (rt *Runtime) Registry() *Registry { return rt.reg }

// Pool returns the primary pool.
func (rt *Runtime) Pool() *pgxpool.Pool { return rt.pool }

// OnCommit adds a function called after every commit that wrote events.
// Call it before the runtime serves requests.
func (rt *Runtime) OnCommit(fn func(events int)) { rt.onCommit = append(rt.onCommit, fn) }

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
	return Metadata{UserID: c.Principal.UserID, RequestID: c.RequestID, CorrelationID: corr, CausationID: cause, IdempotencyKey: c.IdempotencyKey}
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

// unknownType is the 404 for a type nobody registered, with a hint.
func unknownType(kind, typ string, known []string) *Error {
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
	defs := make([]*writeDef, len(cmds))
	for i, c := range cmds {
		d := rt.reg.writes[c.Type]
		if d == nil {
			return nil, rt.batchErr(len(cmds), i, unknownType("write", c.Type, rt.reg.WriteTypes()))
		}
		if err := checkRoles(call.Principal, d.roles, c.Type); err != nil {
			return nil, rt.batchErr(len(cmds), i, err)
		}
		defs[i] = d
	}
	if call.Principal.TenantID == "" {
		return nil, &Error{Code: CodeUnauthorized, Message: "no tenant"}
	}
	results := make([]any, len(cmds))
	var afters []func(context.Context)
	_, err := rt.inTx(ctx, call.Principal.TenantID, call.Principal, call.metadata(), false, func(ctx context.Context, tx *Tx) error {
		for i, c := range cmds {
			out, after, err := defs[i].run(ctx, tx, c.Payload)
			if err == nil && (defs[i].post != nil || rt.needsInline(tx)) {
				err = rt.runInline(ctx, tx)
				if err == nil && defs[i].post != nil {
					err = defs[i].post(ctx, tx, c.Payload, out)
				}
			}
			if err == nil && len(cmds) > 1 {
				// Write this command's appends now, so that a version
				// conflict is attributed to it.
				_, err = tx.Flush(ctx)
			}
			if err != nil {
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
		return nil, err
	}
	for _, a := range afters {
		a(ctx)
	}
	return results, nil
}

func (rt *Runtime) batchErr(n, i int, err error) error {
	if n == 1 {
		return err
	}
	return &BatchError{Index: i, Err: err}
}

// needsInline reports whether buffered events have inline projections.
func (rt *Runtime) needsInline(tx *Tx) bool {
	if len(rt.inline) == 0 {
		return false
	}
	for _, p := range tx.pending {
		for _, e := range p.events {
			if len(rt.inline[e.Type]) > 0 {
				return true
			}
		}
	}
	// Events a read flushed early still wait for their projections.
	for _, env := range tx.flushed {
		if len(rt.inline[env.Type]) > 0 {
			return true
		}
	}
	return false
}

// runInline flushes the buffered events and runs their inline projections
// in the transaction.
func (rt *Runtime) runInline(ctx context.Context, tx *Tx) error {
	for {
		flushed, err := tx.Flush(ctx)
		if err != nil {
			return err
		}
		if len(flushed) == 0 {
			return nil
		}
		tx.flushed = nil
		for _, env := range flushed {
			for _, p := range rt.inline[env.Type] {
				if err := p.Apply(ctx, tx, env); err != nil {
					return err
				}
			}
		}
		// Inline projections may append in turn; loop until quiet.
	}
}

// Query runs a query handler in a read-only transaction of the caller's
// tenant on the read pool.
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
	var out any
	_, err := rt.run(ctx, rt.readPool, call.Principal.TenantID, call.Principal, call.metadata(), true, func(ctx context.Context, tx *Tx) error {
		var err error
		out, err = d.run(ctx, tx, cmd.Payload)
		return err
	})
	return out, err
}

// InTx runs fn in a transaction scoped to tenant (SystemTenantID: all
// tenants) with the given metadata, writes its buffered events (running
// inline projections) and commits. It returns the number of events written.
func (rt *Runtime) InTx(ctx context.Context, tenant string, meta Metadata, fn func(ctx context.Context, tx *Tx) error) (int, error) {
	return rt.inTx(ctx, tenant, Principal{UserID: meta.UserID, TenantID: tenant}, meta, false, fn)
}

func (rt *Runtime) inTx(ctx context.Context, tenant string, p Principal, meta Metadata, readOnly bool, fn func(ctx context.Context, tx *Tx) error) (int, error) {
	return rt.run(ctx, rt.pool, tenant, p, meta, readOnly, func(ctx context.Context, tx *Tx) error {
		if err := fn(ctx, tx); err != nil {
			return err
		}
		if rt.needsInline(tx) {
			return rt.runInline(ctx, tx)
		}
		return nil
	})
}

// run acquires a connection, begins a scoped transaction, runs fn and
// commits, pipelining buffered appends with the COMMIT.
func (rt *Runtime) run(ctx context.Context, pool *pgxpool.Pool, tenant string, p Principal, meta Metadata, readOnly bool, fn func(ctx context.Context, tx *Tx) error) (int, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, &Error{Code: CodeUnavailable, Message: "database unavailable", Err: err}
	}
	defer conn.Release()
	if err := tenancy.Begin(ctx, conn, tenant, tenancy.Options{ReadOnly: readOnly}); err != nil {
		rollback(conn.Conn())
		return 0, err
	}
	tx := newTx(conn.Conn(), rt.reg, tenant, p, meta, readOnly)
	if err := fn(ctx, tx); err != nil {
		rollback(conn.Conn())
		return 0, err
	}
	b := &pgx.Batch{}
	if err := tx.queueFlush(b); err != nil {
		rollback(conn.Conn())
		return 0, err
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		rollback(conn.Conn())
		return 0, err
	}
	if tx.written > 0 {
		for _, f := range rt.onCommit {
			f(tx.written)
		}
	}
	return tx.written, nil
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

// rollbackTimeout bounds the ROLLBACK of a failed transaction.
const rollbackTimeout = 5 * time.Second
