package tenancy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// lazyBundle is a database with a tenant table holding one row of t1 and
// one of t2, and a connection of its own.
type lazyBundle struct {
	db   *kumikotest.DB
	conn *pgxpool.Conn
}

func newLazyBundle(t *testing.T) *lazyBundle {
	t.Helper()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE lazy_items (tenant_id text NOT NULL, note text NOT NULL);
		SELECT kumiko_enable_tenancy('lazy_items');
		INSERT INTO lazy_items VALUES ('t1', 'one'), ('t2', 'two')`)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	return &lazyBundle{db: db, conn: conn}
}

// scopeSQL reports what a statement sees: the tenant setting, the role and
// the visible rows.
const scopeSQL = `SELECT current_setting('kumiko.tenant_id', true), current_user::text, (SELECT count(*) FROM lazy_items), $1::int`

func (b *lazyBundle) txStatus() byte { return b.conn.Conn().PgConn().TxStatus() }

func TestLazyBeginsWithTheFirstStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type first func(l *tenancy.Lazy) (setting, role string, visible int64, err error)
	cases := map[string]first{
		"QueryRow": func(l *tenancy.Lazy) (string, string, int64, error) {
			var s, r string
			var n int64
			var one int
			err := l.QueryRow(ctx, scopeSQL, 1).Scan(&s, &r, &n, &one)
			return s, r, n, err
		},
		"Query": func(l *tenancy.Lazy) (string, string, int64, error) {
			rows, err := l.Query(ctx, scopeSQL, 1)
			if err != nil {
				return "", "", 0, err
			}
			type res struct {
				S, R string
				N    int64
				One  int
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (res, error) {
				var x res
				err := r.Scan(&x.S, &x.R, &x.N, &x.One)
				return x, err
			})
			if err != nil || len(got) != 1 {
				return "", "", 0, errors.Join(err, errors.New("want one row"))
			}
			return got[0].S, got[0].R, got[0].N, nil
		},
		"Exec": func(l *tenancy.Lazy) (string, string, int64, error) {
			if _, err := l.Exec(ctx, `CREATE TEMP TABLE seen_scope ON COMMIT DROP AS `+scopeSQL, 1); err != nil {
				return "", "", 0, err
			}
			var s, r string
			var n int64
			var one int
			err := l.QueryRow(ctx, `SELECT * FROM seen_scope`).Scan(&s, &r, &n, &one)
			return s, r, n, err
		},
		"ExecWithoutArgs": func(l *tenancy.Lazy) (string, string, int64, error) {
			// Simple protocol, two statements: sent after a BEGIN of its own.
			if _, err := l.Exec(ctx, `CREATE TEMP TABLE seen_scope (s text, r text, n bigint) ON COMMIT DROP;
				INSERT INTO seen_scope SELECT current_setting('kumiko.tenant_id', true), current_user::text, (SELECT count(*) FROM lazy_items)`); err != nil {
				return "", "", 0, err
			}
			var s, r string
			var n int64
			err := l.QueryRow(ctx, `SELECT * FROM seen_scope`).Scan(&s, &r, &n)
			return s, r, n, err
		},
		"SendBatch": func(l *tenancy.Lazy) (string, string, int64, error) {
			var s, r string
			var n int64
			var one int
			b := &pgx.Batch{}
			b.Queue(scopeSQL, 1).QueryRow(func(row pgx.Row) error { return row.Scan(&s, &r, &n, &one) })
			err := l.SendBatch(ctx, b).Close()
			return s, r, n, err
		},
	}
	for name, fn := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := newLazyBundle(t)
			l, err := tenancy.BeginLazy(b.conn.Conn(), "t1", tenancy.Options{})
			require.NoError(t, err)
			require.False(t, l.Begun())
			require.Equal(t, byte('I'), b.txStatus(), "nothing is sent before the first statement")
			s, r, n, err := fn(l)
			require.NoError(t, err)
			require.True(t, l.Begun())
			require.Equal(t, byte('T'), b.txStatus(), "the statement ran inside the transaction")
			require.Equal(t, "t1", s)
			require.Equal(t, tenancy.Role, r)
			require.Equal(t, int64(1), n, "only t1's row is visible")
			_, err = l.Exec(ctx, "ROLLBACK")
			require.NoError(t, err)
		})
	}
}

func TestLazySystemTenantAndReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newLazyBundle(t)
	l, err := tenancy.BeginLazy(b.conn.Conn(), tenancy.SystemTenantID, tenancy.Options{ReadOnly: true})
	require.NoError(t, err)
	var s, r string
	var n int64
	var one int
	require.NoError(t, l.QueryRow(ctx, scopeSQL, 1).Scan(&s, &r, &n, &one))
	require.Equal(t, tenancy.SystemTenantID, s)
	require.Equal(t, int64(2), n, "the system tenant sees every row")
	_, err = l.Exec(ctx, `INSERT INTO lazy_items VALUES ($1, 'x')`, "t1")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25006", pgErr.Code, "read-only transaction")
	_, err = l.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
}

func TestLazyCommitBatchBeginsAnEmptyTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newLazyBundle(t)
	l, err := tenancy.BeginLazy(b.conn.Conn(), "t2", tenancy.Options{})
	require.NoError(t, err)
	batch := &pgx.Batch{}
	batch.Queue(`INSERT INTO lazy_items VALUES ($1, 'three')`, "t2")
	var tag string
	batch.Queue("COMMIT").Exec(func(ct pgconn.CommandTag) error { tag = ct.String(); return nil })
	require.NoError(t, l.SendBatch(ctx, batch).Close())
	require.Equal(t, "COMMIT", tag)
	require.Equal(t, byte('I'), b.txStatus())
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM lazy_items WHERE tenant_id = 't2'`).Scan(&n))
	require.Equal(t, int64(2), n)

	// A foreign tenant's row in the same pipeline is refused by row-level
	// security and nothing commits.
	l, err = tenancy.BeginLazy(b.conn.Conn(), "t2", tenancy.Options{})
	require.NoError(t, err)
	batch = &pgx.Batch{}
	batch.Queue(`INSERT INTO lazy_items VALUES ($1, 'ok')`, "t2")
	batch.Queue(`INSERT INTO lazy_items VALUES ($1, 'intruder')`, "t1")
	batch.Queue("COMMIT")
	err = l.SendBatch(ctx, batch).Close()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
	_, err = b.conn.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM lazy_items`).Scan(&n))
	require.Equal(t, int64(3), n)
}

// TestLazyFailedFirstStatementRunsNothingUnscoped: a first statement that
// fails (here: it does not parse, so pgx fails while preparing, before
// anything of the pipeline ran) leaves the Lazy failed; later statements
// are refused instead of running outside the transaction or its scope.
func TestLazyFailedFirstStatementRunsNothingUnscoped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newLazyBundle(t)
	l, err := tenancy.BeginLazy(b.conn.Conn(), "t1", tenancy.Options{})
	require.NoError(t, err)
	_, err = l.Exec(ctx, `INSERT INTO lazy_items VALUES ($1, 'x') RETURNIN nothing`, "t1")
	require.Error(t, err)
	require.True(t, l.Begun(), "the caller must roll back")
	require.Error(t, l.Err())

	_, err = l.Exec(ctx, `INSERT INTO lazy_items VALUES ($1, 'unscoped')`, "t2")
	require.ErrorIs(t, err, l.Err())
	require.ErrorIs(t, l.QueryRow(ctx, `SELECT 1`).Scan(new(int)), l.Err())
	_, err = l.Query(ctx, `SELECT 1`)
	require.ErrorIs(t, err, l.Err())
	require.ErrorIs(t, l.SendBatch(ctx, &pgx.Batch{}).Close(), l.Err())
	_, _ = b.conn.Exec(ctx, "ROLLBACK")
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM lazy_items`).Scan(&n))
	require.Equal(t, int64(2), n)
}

// TestLazyStatementErrorAbortsTheTransaction: a first statement that fails
// in the server runs after BEGIN; the transaction is aborted and the
// connection stays usable after a rollback.
func TestLazyStatementErrorAbortsTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newLazyBundle(t)
	l, err := tenancy.BeginLazy(b.conn.Conn(), "t1", tenancy.Options{})
	require.NoError(t, err)
	var x int
	err = l.QueryRow(ctx, `SELECT 1 / ($1::int - 1)`, 1).Scan(&x)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22012", pgErr.Code)
	require.Equal(t, byte('E'), b.txStatus())
	_, err = l.Exec(ctx, `INSERT INTO lazy_items VALUES ($1, 'after')`, "t1")
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "25P02", pgErr.Code, "in failed transaction")
	_, err = b.conn.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)

	// No rows: pgx.ErrNoRows, and the connection is free again.
	l, err = tenancy.BeginLazy(b.conn.Conn(), "t1", tenancy.Options{})
	require.NoError(t, err)
	require.ErrorIs(t, l.QueryRow(ctx, `SELECT 1 FROM lazy_items WHERE note = $1`, "two").Scan(&x), pgx.ErrNoRows, "t2's row is invisible")
	require.NoError(t, l.QueryRow(ctx, `SELECT count(*) FROM lazy_items WHERE note <> $1`, "").Scan(&x))
	require.Equal(t, 1, x)
	_, err = l.Exec(ctx, "COMMIT")
	require.NoError(t, err)
}

// TestSwitchLazilyRescopesWithTheNextStatement: in an open transaction of
// t1, a lazy switch to t2 takes effect with the next statement (in its
// pipeline), and an unused switch changes nothing.
func TestSwitchLazilyRescopesWithTheNextStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newLazyBundle(t)
	require.NoError(t, tenancy.Begin(ctx, b.conn, "t1", tenancy.Options{}))
	scope := func(db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	}) (string, int64) {
		var s, r string
		var n int64
		var one int
		require.NoError(t, db.QueryRow(ctx, scopeSQL, 1).Scan(&s, &r, &n, &one))
		require.Equal(t, tenancy.Role, r)
		return s, n
	}
	unused := tenancy.SwitchLazily(b.conn.Conn(), "t2")
	require.False(t, unused.Begun())
	s, _ := scope(b.conn)
	require.Equal(t, "t1", s, "an unused switch sends nothing")

	l := tenancy.SwitchLazily(b.conn.Conn(), "t2")
	s, n := scope(l)
	require.True(t, l.Begun())
	require.Equal(t, "t2", s)
	require.Equal(t, int64(1), n)
	_, err := l.Exec(ctx, `INSERT INTO lazy_items VALUES ($1, 'mine')`, "t2")
	require.NoError(t, err)
	_, err = l.Exec(ctx, `INSERT INTO lazy_items VALUES ($1, 'theirs')`, "t1")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, "row-level security of t2")
	_, err = b.conn.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
	require.Equal(t, byte('I'), b.txStatus())
}
