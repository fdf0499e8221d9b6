package framework

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// Principal is the authenticated caller of a request.
type Principal = auth.Principal

// SystemTenantID is the tenant of framework-internal work; its transactions
// see every tenant.
const SystemTenantID = tenancy.SystemTenantID

// Expected-version values for [Tx.Append].
const (
	// AnyVersion appends at whatever version the stream has.
	AnyVersion = eventstore.AnyVersion
	// NoStream appends only when the stream does not exist yet.
	NoStream = eventstore.NoStream
)

// AsOf bounds an aggregate read by version or time; the zero value is "now".
type AsOf = eventstore.AsOf

// DB is the statement interface of a transaction.
type DB = eventstore.DB

// Tx is the tenant-scoped transaction a handler runs in: write and query
// handlers, inline and multi-stream projections, and jobs all get one. Its
// statements (Exec, Query, QueryRow, SendBatch) are confined by row-level
// security to [Tx.TenantID]'s rows.
//
// Appended events are buffered and written when the Tx flushes them (after
// the handler, before postSave hooks, when a read needs them), or pipelined
// with the COMMIT when none of them has an inline projection. Every flush
// runs the inline projections of the events it writes in this transaction,
// whoever appended them: a write handler, a job's InTx, a saga in a
// dispatcher pass, or an inline projection. Call [Tx.Flush] to write them
// earlier (for example to read them back).
//
// A Tx is valid only until the handler it was passed to returns: the
// transaction ends then, and a dispatcher pass reuses the Tx for its next
// event. Do not keep it, or hand it to a goroutine that outlives the call:
// the Tx of a write, a query or [Runtime.InTx] fails every later call with
// [ErrTxDone].
type Tx struct {
	db        DB
	reg       *Registry
	tenant    string
	principal Principal
	meta      Metadata
	readOnly  bool

	pending []pendingAppend
	// flushed holds the envelopes written and not yet handed to the inline
	// projections.
	flushed []Envelope
	// flushErr is the error of a flush that failed (writing its events or
	// running an inline projection); every later flush returns it.
	flushErr error
	// written counts every event this Tx wrote.
	written int
	// done is set when the transaction ended (see [Tx.end]).
	done bool
	// cmd is the index of the batch command running now; appends carry it,
	// so that a failed append is attributed to the command that made it.
	cmd int
	// failedCmd is 1 + the command index of the append that failed last (0:
	// none failed).
	failedCmd int
}

type pendingAppend struct {
	stream   eventstore.StreamRef
	expected int64
	events   []eventstore.NewEvent
	// cmd is the batch command that appended (see Tx.cmd).
	cmd int
}

// newTx wraps an open, already scoped transaction.
func newTx(db DB, reg *Registry, tenant string, p Principal, meta Metadata, readOnly bool) *Tx {
	return &Tx{db: db, reg: reg, tenant: tenant, principal: p, meta: meta, readOnly: readOnly}
}

// end marks the transaction ended: its connection is back in the pool,
// where a statement would run outside the transaction and its tenant scope
// (or in another request's transaction), so every later call fails with
// [ErrTxDone].
func (t *Tx) end() {
	t.done = true
	t.db = doneDB{}
	t.pending = nil
	t.flushed = nil
}

// doneDB is the DB of an ended Tx: every statement fails with ErrTxDone.
type doneDB struct{}

func (doneDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, ErrTxDone
}
func (doneDB) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, ErrTxDone }
func (doneDB) QueryRow(context.Context, string, ...any) pgx.Row {
	return tenancy.FailedRow(ErrTxDone)
}
func (doneDB) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	return tenancy.FailedBatch(ErrTxDone)
}

// Exec runs a statement in the transaction.
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.db.Exec(ctx, sql, args...)
}

// Query runs a query in the transaction.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.db.Query(ctx, sql, args...)
}

// QueryRow runs a single-row query in the transaction.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.db.QueryRow(ctx, sql, args...)
}

// SendBatch pipelines several statements in the transaction.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.db.SendBatch(ctx, b)
}

// TenantID returns the tenant the transaction is scoped to.
func (t *Tx) TenantID() string { return t.tenant }

// Principal returns the caller (zero for system work).
func (t *Tx) Principal() Principal { return t.principal }

// UserID returns the caller's user id ("" for system work).
func (t *Tx) UserID() string { return t.meta.UserID }

// RequestID returns the HTTP request id, when there is one.
func (t *Tx) RequestID() string { return t.meta.RequestID }

// CorrelationID returns the correlation id every event appended here carries.
func (t *Tx) CorrelationID() string { return t.meta.CorrelationID }

// CausationID returns the causation id every event appended here carries
// (the triggering event's id in projections and jobs, the request id in
// write handlers).
func (t *Tx) CausationID() string { return t.meta.CausationID }

// ErrTxDone is returned by every method of a [Tx] called after the
// transaction it belongs to ended (its handler returned; it committed or
// rolled back).
var ErrTxDone = errors.New("kumiko: Tx used after its transaction ended (keep no Tx past the handler it was passed to)")

// ErrReadOnly is returned by [Tx.Append] in a query handler.
var ErrReadOnly = errors.New("kumiko: append in a read-only transaction")

// Append adds events to the stream (in the transaction's tenant) at the
// expected version ([AnyVersion], [NoStream], or the version the stream must
// be at). It checks each event at the call site: an event type not declared
// in this registry is an error, and a payload that fails its validator tags
// is a *[ValidationError]; nothing is buffered then, and the transaction
// fails with that error when it would commit, also if the caller ignores it
// (its other writes must not commit without the event). A version mismatch is
// reported when the events are written, as a *[ConcurrencyError].
func (t *Tx) Append(stream Stream, expectedVersion int64, events ...PendingEvent) error {
	if t.done {
		return ErrTxDone
	}
	if t.readOnly {
		return ErrReadOnly
	}
	out, err := t.newEvents(stream, expectedVersion, events)
	if err != nil {
		// A refused append fails the transaction, also when the handler
		// drops this error: its business writes must not commit without
		// the event (the next Flush, and so the commit, returns it). An
		// empty append loses nothing.
		if t.flushErr == nil && !errors.Is(err, eventstore.ErrEmptyAppend) {
			t.flushErr = err
		}
		return err
	}
	ref := eventstore.StreamRef{TenantID: t.tenant, Type: stream.Type, ID: stream.ID}
	t.pending = append(t.pending, pendingAppend{stream: ref, expected: expectedVersion, events: out, cmd: t.cmd})
	return nil
}

// newEvents checks an append (stream, expected version, declared types,
// payloads) and encodes its events.
func (t *Tx) newEvents(stream Stream, expectedVersion int64, events []PendingEvent) ([]eventstore.NewEvent, error) {
	if stream.Type == "" || stream.ID == "" {
		return nil, fmt.Errorf("kumiko: append to incomplete stream %q", stream.String())
	}
	if len(events) == 0 {
		return nil, eventstore.ErrEmptyAppend
	}
	if expectedVersion < AnyVersion {
		return nil, fmt.Errorf("kumiko: invalid expected version %d", expectedVersion)
	}
	out := make([]eventstore.NewEvent, 0, len(events))
	for _, e := range events {
		if e.def == nil || t.reg.events[e.def.qualified] != e.def {
			return nil, fmt.Errorf("kumiko: append of undeclared event type %q (declare it with DefineEvent in this registry)", e.Type())
		}
		if err := ValidatePayload(e.payload); err != nil {
			return nil, err
		}
		b, err := json.Marshal(e.payload)
		if err != nil {
			return nil, fmt.Errorf("kumiko: encode %s payload: %w", e.def.qualified, err)
		}
		out = append(out, eventstore.NewEvent{Type: e.def.qualified, TypeVersion: e.def.version, Payload: b, Metadata: t.meta})
	}
	return out, nil
}

// queueFlush queues every pending append on b in lock order (streams
// sorted; appends to one stream in call order) and clears the buffer.
func (t *Tx) queueFlush(b *pgx.Batch) error {
	if len(t.pending) == 0 {
		return nil
	}
	pend := t.pending
	t.pending = nil
	slices.SortStableFunc(pend, func(a, b pendingAppend) int { return eventstore.SortStreams(a.stream, b.stream) })
	for _, p := range pend {
		err := eventstore.QueueAppend(b, p.stream, p.expected, p.events, func(res []eventstore.Appended, err error) error {
			if err != nil {
				t.failedCmd = p.cmd + 1
				return err
			}
			for i, a := range res {
				e := p.events[i]
				t.flushed = append(t.flushed, Envelope{
					Position: a.Position, CommitKey: a.CommitKey, TenantID: p.stream.TenantID,
					StreamType: p.stream.Type, StreamID: p.stream.ID, Version: a.Version,
					Type: e.Type, TypeVersion: e.TypeVersion, Payload: e.Payload, Metadata: e.Metadata, CreatedAt: a.CreatedAt,
				})
			}
			t.written += len(res)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Flush writes the buffered events now and runs their inline projections in
// the transaction, once per event; events those projections append are
// written and projected in turn, until none are left. It returns the events
// it wrote. A failing write (such as a *[ConcurrencyError]) or inline
// projection returns its error; the transaction must then be rolled back.
// That error is returned by every later Flush too (and [Tx.HasPending]
// reports true), so a transaction whose events were not all written, or
// whose event's projection failed, in a read's flush cannot commit when the
// handler ignores the read's error (or rolls back to a savepoint).
func (t *Tx) Flush(ctx context.Context) ([]Envelope, error) {
	if t.done {
		return nil, ErrTxDone
	}
	if t.flushErr != nil {
		return nil, t.flushErr
	}
	var out []Envelope
	for {
		if len(t.pending) > 0 {
			b := &pgx.Batch{}
			if err := t.queueFlush(b); err != nil {
				return nil, err
			}
			if err := t.db.SendBatch(ctx, b).Close(); err != nil {
				// The appends queued behind the failure were never
				// written: nothing may commit without them, also when
				// the caller goes on (past a savepoint it rolled back).
				t.flushErr = err
				return nil, err
			}
		}
		if len(t.flushed) == 0 {
			return out, nil
		}
		// Taken before the projections run: an event is projected once,
		// also when a projection flushes (a read) in the middle.
		written := t.flushed
		t.flushed = nil
		if out == nil {
			out = written
		} else {
			out = append(out, written...)
		}
		for _, env := range written {
			for _, p := range t.reg.inline[env.Type] {
				if err := t.applyInline(ctx, p, env); err != nil {
					t.flushErr = err
					return nil, err
				}
			}
		}
	}
}

// applyInline runs inline projection p for env. What p appends was caused
// by env: those events carry env's id as causation id (and [Tx.CausationID]
// returns it while p runs), as the appends of a multi-stream projection do.
func (t *Tx) applyInline(ctx context.Context, p *Projection, env Envelope) error {
	cause := t.meta.CausationID
	t.meta.CausationID = strconv.FormatInt(env.Position, 10)
	defer func() { t.meta.CausationID = cause }()
	return p.Apply(ctx, t, env)
}

// needsFlush reports whether the transaction holds events whose inline
// projections have not run (buffered), or a flush failed; other buffered
// events can wait for the COMMIT.
func (t *Tx) needsFlush() bool {
	if t.flushErr != nil {
		return true
	}
	if len(t.reg.inline) == 0 {
		return false
	}
	for _, p := range t.pending {
		for _, e := range p.events {
			if len(t.reg.inline[e.Type]) > 0 {
				return true
			}
		}
	}
	for _, env := range t.flushed {
		if len(t.reg.inline[env.Type]) > 0 {
			return true
		}
	}
	return false
}

// failedCommand returns the batch command whose append failed (see
// Tx.cmd), if one did.
func (t *Tx) failedCommand() (int, bool) { return t.failedCmd - 1, t.failedCmd > 0 }

// streamRef qualifies a stream with the transaction's tenant.
func (t *Tx) streamRef(s Stream) eventstore.StreamRef {
	return eventstore.StreamRef{TenantID: t.tenant, Type: s.Type, ID: s.ID}
}

// FetchForWriting locks the stream's head row (when it exists) and returns
// its events and current version (0 for a new stream); append with that
// version to guard against a concurrent writer. Buffered appends are written
// first.
func (t *Tx) FetchForWriting(ctx context.Context, stream Stream) ([]Envelope, int64, error) {
	if _, err := t.Flush(ctx); err != nil {
		return nil, 0, err
	}
	return eventstore.FetchForWriting(ctx, t.db, t.streamRef(stream))
}

// ReadStream returns the stream's events in version order as of asOf.
// Buffered appends are written first.
func (t *Tx) ReadStream(ctx context.Context, stream Stream, asOf AsOf) ([]Envelope, error) {
	if _, err := t.Flush(ctx); err != nil {
		return nil, err
	}
	return eventstore.ReadStream(ctx, t.db, t.streamRef(stream), asOf)
}

// translatePg maps the Postgres errors a client can cause to *Error. A
// failure to begin or scope the transaction (*tenancy.ScopeError) is not
// one: its 42501 is a missing membership in kumiko_tenant, a server
// misconfiguration (internal), not a row-level security violation.
func translatePg(err error) *Error {
	if _, ok := errors.AsType[*tenancy.ScopeError](err); ok {
		return nil
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil
	}
	switch pgErr.Code {
	case "42501": // insufficient_privilege, including row-level security violations
		return &Error{Code: CodeAccessDenied, Message: "access denied", Err: err}
	case "23505": // unique_violation
		return &Error{Code: CodeConflict, Message: "conflict: " + pgErr.ConstraintName + " already exists", Err: err}
	case "23503": // foreign_key_violation: a reference to a row that does not exist (or one still referenced)
		return &Error{Code: CodeConflict, Message: "conflict: violates " + pgErr.ConstraintName + " (a referenced row is missing or still referenced)", Err: err}
	case "23514": // check_violation
		return &Error{Code: CodeValidation, Message: "a value violates " + pgErr.ConstraintName, Err: err}
	case "23502": // not_null_violation
		return &Error{Code: CodeValidation, Message: "a value is required: " + pgErr.ColumnName, Err: err}
	case "40001", "40P01": // serialization failure, deadlock
		return &Error{Code: CodeConflict, Message: "conflict with a concurrent write, retry", Err: err}
	case "22001": // string_data_right_truncation
		return &Error{Code: CodeValidation, Message: "value too long", Err: err}
	case "22003": // numeric_value_out_of_range: a number too large for its column or for jsonb
		return &Error{Code: CodeValidation, Message: "a value is out of range", Err: err}
	case "54000": // program_limit_exceeded: a value over a size limit, such as an index row's (a long stream id or unique key)
		return &Error{Code: CodeValidation, Message: "a value is too large for the database (" + pgErr.Message + ")", Err: err}
	case "22021", "22P05": // character_not_in_repertoire, untranslatable_character: a NUL in text or jsonb, or bytes that are not UTF-8
		return &Error{Code: CodeValidation, Message: "a value contains a character the database cannot store (NUL, \\u0000) or is not valid UTF-8", Err: err}
	}
	return nil
}

// NewEventTx wraps an open transaction for a handler reacting to env (a
// projection or a job): it is scoped to env's tenant, and events it appends
// carry env's correlation id and env's id as causation id. reg must be
// built ([Registry.Build]). The caller must have scoped the transaction to
// env.TenantID (tenancy.Switch) and must flush it (see [Tx.Flush], which
// also runs the inline projections of the appended events) before
// committing. Used by the dispatcher.
func NewEventTx(db DB, reg *Registry, env Envelope) *Tx {
	return ReuseEventTx(nil, db, reg, env)
}

// ReuseEventTx is [NewEventTx] that overwrites t, a Tx of an earlier event
// whose handler has returned (nil: a new one), so that a pass over many
// events allocates one Tx. Nothing of the earlier event remains in it.
func ReuseEventTx(t *Tx, db DB, reg *Registry, env Envelope) *Tx {
	if t == nil {
		t = new(Tx)
	}
	causation := strconv.FormatInt(env.Position, 10)
	*t = Tx{
		db: db, reg: reg, tenant: env.TenantID,
		principal: Principal{UserID: env.Metadata.UserID, TenantID: env.TenantID},
		meta: Metadata{
			UserID:        env.Metadata.UserID,
			CorrelationID: cmp.Or(env.Metadata.CorrelationID, causation),
			CausationID:   causation,
		},
	}
	return t
}

// HasPending reports whether appended events wait to be written, or a
// flush failed (the next [Tx.Flush] returns its error).
func (t *Tx) HasPending() bool { return len(t.pending) > 0 || t.flushErr != nil }

// Written returns how many events this Tx has written so far.
func (t *Tx) Written() int { return t.written }

// Queuer is implemented by connections that can defer a statement and send
// it in one pipeline with later ones (the dispatcher's pass connection).
type Queuer interface {
	// Queue defers sql; an error means it ran at once and failed.
	Queue(ctx context.Context, sql string, args ...any) error
}

// Queue runs one statement whose result the handler does not need. In a
// dispatcher pass it is deferred and sent in one pipeline with the pass's
// next statement or with its COMMIT, which saves a round trip per event for
// projections that only write: use it for upserts into a projection's table.
// Every later statement of the transaction runs after it, so reading the
// row back works. Elsewhere it runs at once. A deferred statement that fails
// fails the pass, which is then re-run with every statement sent at once,
// so the failure is attributed to its event as usual.
func (t *Tx) Queue(ctx context.Context, sql string, args ...any) error {
	if q, ok := t.db.(Queuer); ok {
		return q.Queue(ctx, sql, args...)
	}
	_, err := t.db.Exec(ctx, sql, args...)
	return err
}
