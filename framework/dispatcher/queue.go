package dispatcher

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// errQueueFailed reports that a deferred statement failed: the pass cannot
// tell which event's it was, so it is re-run with statements sent at once.
var errQueueFailed = errors.New("a deferred statement failed")

// queuedStmt is a statement deferred by [framework.Tx.Queue].
type queuedStmt struct {
	tenant string
	sql    string
	args   []any
}

// passDB is the connection a handler's Tx gets in a pass: statements go
// through the lazily scoped connection, after the deferred ones.
type passDB struct {
	s      *scopes
	tenant string
	inner  framework.DB
	// lazy is inner when it is a switch of scope (nil otherwise).
	lazy *tenancy.Lazy
}

// Queue defers sql to the pass's next statement or its commit (at once in
// direct mode).
func (p *passDB) Queue(ctx context.Context, sql string, args ...any) error {
	if p.s.direct {
		_, err := p.Exec(ctx, sql, args...)
		return err
	}
	p.s.queue = append(p.s.queue, queuedStmt{tenant: p.tenant, sql: sql, args: args})
	return nil
}

// Exec implements framework.DB.
func (p *passDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := p.s.flushQueue(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return p.inner.Exec(ctx, sql, args...)
}

// Query implements framework.DB.
func (p *passDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := p.s.flushQueue(ctx); err != nil {
		return nil, err
	}
	return p.inner.Query(ctx, sql, args...)
}

// QueryRow implements framework.DB.
func (p *passDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := p.s.flushQueue(ctx); err != nil {
		return tenancy.FailedRow(err)
	}
	return p.inner.QueryRow(ctx, sql, args...)
}

// SendBatch implements framework.DB.
func (p *passDB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := p.s.flushQueue(ctx); err != nil {
		return tenancy.FailedBatch(err)
	}
	return p.inner.SendBatch(ctx, b)
}

// queueDeferred adds the deferred statements to b, each in its tenant's
// scope, starting from scope from; it returns the scope in effect after
// them.
func (s *scopes) queueDeferred(b *pgx.Batch, from string) string {
	cur := from
	for _, q := range s.queue {
		if q.tenant != cur {
			tenancy.QueueScope(b, q.tenant)
			cur = q.tenant
		}
		b.Queue(q.sql, q.args...)
	}
	s.queue = nil
	return cur
}

// flushQueue sends the deferred statements before a handler's statement,
// restoring the scope in effect.
func (s *scopes) flushQueue(ctx context.Context) error {
	if s.queueErr != nil {
		return s.queueErr
	}
	if len(s.queue) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	if cur := s.queueDeferred(b, s.applied); cur != s.applied && s.applied != "" {
		tenancy.QueueScope(b, s.applied)
	}
	if err := s.conn.SendBatch(ctx, b).Close(); err != nil {
		s.queueErr = fmt.Errorf("%w: %w", errQueueFailed, err)
		return s.queueErr
	}
	return nil
}
