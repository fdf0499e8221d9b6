package tenancy

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LazyConn is the part of *pgx.Conn a [Lazy] transaction needs.
type LazyConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Lazy is a tenant-scoped transaction that begins with its first statement:
// BEGIN and the scoping statements travel in one pipeline with that
// statement (or with the batch that commits), so a transaction costs one
// round trip less than [Begin] followed by its statements. No statement of
// the caller runs before BEGIN and the scope succeeded: they precede it in
// the same pipeline, and an error there aborts the transaction (and so the
// statement).
//
// Statements that cannot join a pipeline (Exec without arguments, which
// pgx sends with the simple protocol and which may hold several
// statements; statements with pgx query options) are preceded by a round
// trip of their own, as with Begin.
//
// After a pipeline carrying the BEGIN failed, the transaction's state is
// unknown: every later statement fails with that error, and the caller
// must roll back. A Lazy is used by one goroutine.
type Lazy struct {
	conn     LazyConn
	tenant   string
	readOnly bool
	lock     string
	// open: the transaction is open already; the prefix is only the scope.
	open  bool
	begun bool
	err   error
}

// BeginLazy returns a transaction on conn scoped to tenant that begins with
// its first statement. Nothing is sent yet; it fails only on an empty
// tenant.
func BeginLazy(conn LazyConn, tenant string, opts Options) (*Lazy, error) {
	if tenant == "" {
		return nil, fmt.Errorf("tenancy: empty tenant id")
	}
	return &Lazy{conn: conn, tenant: tenant, readOnly: opts.ReadOnly, lock: opts.Lock}, nil
}

// SwitchLazily re-scopes the open transaction on conn to tenant with the
// next statement sent through the returned Lazy (the dispatcher runs the
// events of several tenants in one pass): the scoping statements travel in
// one pipeline with that statement. If no statement is sent, the
// transaction keeps its scope.
func SwitchLazily(conn LazyConn, tenant string) *Lazy {
	return &Lazy{conn: conn, tenant: tenant, open: true}
}

// Begun reports whether BEGIN (for [SwitchLazily]: the scope) was sent, or
// its pipeline failed: only then is there a transaction to roll back (or a
// new scope in effect).
func (l *Lazy) Begun() bool { return l.begun || l.err != nil }

// Err returns the error of a failed pipeline that carried the BEGIN.
func (l *Lazy) Err() error { return l.err }

// queuePrefix queues BEGIN and the scope; it returns how many statements
// it queued.
func (l *Lazy) queuePrefix(b *pgx.Batch) int {
	n := b.Len()
	switch {
	case l.open:
	case l.readOnly:
		b.Queue(`BEGIN READ ONLY`)
	default:
		b.Queue(`BEGIN`)
	}
	lock := ""
	if !l.open {
		lock = l.lock
	}
	queueScope(b, l.tenant, lock)
	return b.Len() - n
}

// fail records the failure of a pipeline that carried the prefix.
func (l *Lazy) fail(err error) error {
	l.err = &ScopeError{Tenant: l.tenant, Switch: l.open, Err: err}
	return l.err
}

// readPrefix reads the results of the n prefix statements of br. On error
// it records the failure and closes br.
func (l *Lazy) readPrefix(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return l.fail(err)
		}
	}
	l.begun = true
	return nil
}

// Begin sends BEGIN and the scope now, in their own round trip, unless
// they were sent already.
func (l *Lazy) Begin(ctx context.Context) error {
	if l.err != nil || l.begun {
		return l.err
	}
	b := &pgx.Batch{}
	n := l.queuePrefix(b)
	br := l.conn.SendBatch(ctx, b)
	if err := l.readPrefix(br, n); err != nil {
		return err
	}
	if err := br.Close(); err != nil {
		return l.fail(err)
	}
	return nil
}

// pipelinable reports whether a statement with args can be queued on a
// batch behind the prefix with the same meaning as sent alone.
func pipelinable(args []any, isExec bool) bool {
	if isExec && len(args) == 0 {
		return false // simple protocol: possibly several statements
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryRewriter, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
	}
	return true
}

// Exec runs a statement in the transaction.
func (l *Lazy) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if l.err != nil {
		return pgconn.CommandTag{}, l.err
	}
	if l.begun || !pipelinable(args, true) {
		if err := l.Begin(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		return l.conn.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	n := l.queuePrefix(b)
	b.Queue(sql, args...)
	br := l.conn.SendBatch(ctx, b)
	if err := l.readPrefix(br, n); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs a query in the transaction.
func (l *Lazy) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if l.err != nil {
		return nil, l.err
	}
	if l.begun || !pipelinable(args, false) {
		if err := l.Begin(ctx); err != nil {
			return nil, err
		}
		return l.conn.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	n := l.queuePrefix(b)
	b.Queue(sql, args...)
	br := l.conn.SendBatch(ctx, b)
	if err := l.readPrefix(br, n); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		if cerr := br.Close(); cerr != nil && !errors.Is(cerr, err) {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs a single-row query in the transaction.
func (l *Lazy) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if l.err == nil && (l.begun || !pipelinable(args, false)) {
		if err := l.Begin(ctx); err != nil {
			return errRow{err}
		}
		return l.conn.QueryRow(ctx, sql, args...)
	}
	rows, err := l.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return &lazyRow{rows: rows}
}

// SendBatch pipelines b in the transaction (behind BEGIN and the scope if
// they were not sent yet).
func (l *Lazy) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if l.err != nil {
		return errBatch{l.err}
	}
	if l.begun {
		return l.conn.SendBatch(ctx, b)
	}
	full := &pgx.Batch{}
	n := l.queuePrefix(full)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	br := l.conn.SendBatch(ctx, full)
	if err := l.readPrefix(br, n); err != nil {
		return errBatch{err}
	}
	return br
}

// batchRows are the rows of a pipelined query; the pipeline ends (the
// connection is free again) when the rows are exhausted or closed.
type batchRows struct {
	pgx.Rows
	br    pgx.BatchResults
	done  bool
	brErr error
}

func (r *batchRows) finish() {
	if !r.done {
		r.done = true
		r.brErr = r.br.Close()
	}
}

// Next advances to the next row; after the last one the pipeline ends.
func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

// Close closes the rows and ends the pipeline.
func (r *batchRows) Close() {
	r.Rows.Close()
	r.finish()
}

// Err returns the query's error, else the pipeline's.
func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.brErr
}

// lazyRow is QueryRow's row over pipelined rows, with pgx's semantics.
type lazyRow struct{ rows pgx.Rows }

// Scan reads the first row into dest and closes the rows; no row is
// pgx.ErrNoRows.
func (r *lazyRow) Scan(dest ...any) error {
	rows := r.rows
	defer rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// FailedRow returns a pgx.Row whose Scan fails with err: what a wrapper
// of a connection answers when it could not run the statement.
func FailedRow(err error) pgx.Row { return errRow{err} }

// FailedBatch returns pgx.BatchResults whose every call fails with err:
// what a wrapper of a connection answers when it could not send the batch.
func FailedBatch(err error) pgx.BatchResults { return errBatch{err} }

// errRow is a pgx.Row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is the pgx.BatchResults of a batch that failed before its
// caller's statements.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
