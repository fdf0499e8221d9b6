package dispatcher

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// scopedConn is the pass connection as handlers see it: it re-scopes the
// pass's transaction to the tenant of the event being applied only when the
// handler sends its first statement, so events whose handler does not touch
// the database (no handler for the type, in-memory consumers such as SSE)
// cost no scoping round trip. No statement runs before the switch
// succeeded.
type scopedConn struct {
	conn *pgx.Conn
	// applied is the scope in effect in the transaction.
	applied string
	// want is the scope the current event's statements need.
	want string
	// err is the first failed switch; the transaction is aborted then.
	err error
}

// ensure switches the transaction to want if it is not scoped to it yet.
func (s *scopedConn) ensure(ctx context.Context) error {
	if s.err != nil {
		return s.err
	}
	if s.want == s.applied {
		return nil
	}
	if err := tenancy.Switch(ctx, s.conn, s.want); err != nil {
		s.err = err
		return err
	}
	s.applied = s.want
	return nil
}

// Exec implements eventstore.DB.
func (s *scopedConn) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := s.ensure(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return s.conn.Exec(ctx, sql, args...)
}

// Query implements eventstore.DB.
func (s *scopedConn) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := s.ensure(ctx); err != nil {
		return nil, err
	}
	return s.conn.Query(ctx, sql, args...)
}

// QueryRow implements eventstore.DB.
func (s *scopedConn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := s.ensure(ctx); err != nil {
		return errRow{err}
	}
	return s.conn.QueryRow(ctx, sql, args...)
}

// SendBatch implements eventstore.DB.
func (s *scopedConn) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := s.ensure(ctx); err != nil {
		return errBatch{err}
	}
	return s.conn.SendBatch(ctx, b)
}

// errRow is a pgx.Row whose Scan fails with err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is a pgx.BatchResults of a batch that was never sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }
