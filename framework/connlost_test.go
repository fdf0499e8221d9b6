package framework_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestWriteOnAConnectionTheServerEndedIsUnavailable: when the server ends
// the pool's connections (a restart's fast shutdown, a crash, an operator's
// pg_terminate_backend), a write or query that takes one of them before
// the pool has noticed fails before anything reached the database, so it
// is 503 unavailable (retry), as when the pool cannot connect, not a 500
// internal. Nothing is written, and the next write gets a new connection.
func TestWriteOnAConnectionTheServerEndedIsUnavailable(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, nil)
	admin, err := pgx.Connect(t.Context(), b.db.URL)
	require.NoError(t, err)
	defer admin.Close(t.Context())
	terminate := func() {
		t.Helper()
		// The pool's idle connections, as a shutdown ends them.
		_, err := admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		require.NoError(t, err)
	}

	b.place(t, "t1", "warm-up")
	terminate()
	_, err = b.write(t, callAs("t1", "u-t1"), "orders:write:place", orders.PlaceInput{Customer: "ada", AmountCents: 100})
	require.Error(t, err)
	fe := framework.ToError(err)
	require.Equal(t, framework.CodeUnavailable, fe.Code, "%v", err)
	require.Equal(t, http.StatusServiceUnavailable, fe.Code.HTTPStatus())
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM orders WHERE customer = 'ada'`))

	_, err = b.rt.Query(t.Context(), callAs("t1", "u-t1"), command(t, "orders:query:totals", orders.TotalsInput{}))
	require.NoError(t, err)
	terminate()
	_, err = b.rt.Query(t.Context(), callAs("t1", "u-t1"), command(t, "orders:query:totals", orders.TotalsInput{}))
	require.Error(t, err)
	require.Equal(t, framework.CodeUnavailable, framework.ToError(err).Code, "%v", err)

	b.place(t, "t1", "after")
}

// A batch of several commands whose connection the server ended is 503
// unavailable like a single write, with the failed command's index: the
// runtime names the index in a *BatchError, which must not hide the
// unavailable code (a keyed batch's 500 would be stored and replayed
// although nothing committed).
func TestBatchOnAConnectionTheServerEndedIsUnavailable(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, nil)
	admin, err := pgx.Connect(t.Context(), b.db.URL)
	require.NoError(t, err)
	defer admin.Close(t.Context())

	b.place(t, "t1", "warm-up")
	_, err = admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`)
	require.NoError(t, err)
	_, err = b.rt.Write(t.Context(), callAs("t1", "u-t1"), []framework.Command{
		command(t, "orders:write:place", orders.PlaceInput{Customer: "ada", AmountCents: 100}),
		command(t, "orders:write:place", orders.PlaceInput{Customer: "bea", AmountCents: 100}),
	})
	require.Error(t, err)
	fe := framework.ToError(err)
	require.Equal(t, framework.CodeUnavailable, fe.Code, "%v", err)
	require.Equal(t, 0, fe.Details.(map[string]any)["index"], "%v", err)
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM orders WHERE customer IN ('ada', 'bea')`))
}

// slowInput is the payload of the slow write of
// TestWriteWhoseSessionTheServerTimedOutIsUnavailable.
type slowInput struct {
	Name string `json:"name"`
}

// When the server ends a write's session with a FATAL error of its own
// (here idle_in_transaction_session_timeout, which the docs recommend, while
// the handler waited between two statements), the connection is gone and
// no COMMIT was sent: 503 unavailable (retry), not a 500 (which a keyed
// write would store and replay for a day, although nothing committed).
func TestWriteWhoseSessionTheServerTimedOutIsUnavailable(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		framework.Write(r.Feature("slow-test"), "slow", func(ctx context.Context, tx *framework.Tx, in slowInput) (string, error) {
			if _, err := tx.Exec(ctx, `SELECT set_config('idle_in_transaction_session_timeout', '50ms', true)`); err != nil {
				return "", err
			}
			time.Sleep(500 * time.Millisecond)
			_, err := tx.Exec(ctx, `SELECT $1::text`, in.Name)
			return in.Name, err
		}, nil)
	})
	_, err := b.write(t, callAs("t1", "u-t1"), "slow-test:write:slow", slowInput{Name: "x"})
	require.Error(t, err)
	require.Equal(t, framework.CodeUnavailable, framework.ToError(err).Code, "%v", err)
	b.place(t, "t1", "after")
}

// A handler that bounds its own statement with a context deadline makes
// pgx close the connection when the deadline fires: nothing committed, so
// the write is 503 unavailable (a retry is safe), but its message names
// the deadline, not a database that is down.
func TestWriteWhoseStatementOutlivedTheHandlersDeadline(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		framework.Write(r.Feature("slow-test"), "bounded", func(ctx context.Context, tx *framework.Tx, in slowInput) (string, error) {
			ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			_, err := tx.Exec(ctx, `SELECT pg_sleep(2), $1::text`, in.Name)
			return in.Name, err
		}, nil)
		framework.Write(r.Feature("slow-test"), "cancelled", func(ctx context.Context, tx *framework.Tx, in slowInput) (string, error) {
			ctx, cancel := context.WithCancel(ctx)
			defer time.AfterFunc(50*time.Millisecond, cancel).Stop()
			_, err := tx.Exec(ctx, `SELECT pg_sleep(2), $1::text`, in.Name)
			return in.Name, err
		}, nil)
	})
	for typ, word := range map[string]string{"slow-test:write:bounded": "deadline", "slow-test:write:cancelled": "cancelled"} {
		_, err := b.write(t, callAs("t1", "u-t1"), typ, slowInput{Name: "x"})
		require.Error(t, err)
		fe := framework.ToError(err)
		require.Equal(t, framework.CodeUnavailable, fe.Code, "%v", err)
		require.Contains(t, fe.Message, word, "%v", err)
		require.NotContains(t, fe.Message, "database unavailable")
	}
	b.place(t, "t1", "after")
}

// quantityInput is the payload of encode-test's writes.
type quantityInput struct {
	Quantity int64 `json:"quantity"`
}

// A value the driver cannot encode for its parameter (a client's number
// too large for an int4, which the handler did not bound with a validator
// tag) fails the write as the handler's error, wherever the statement
// comes: not as 503 unavailable, which says the database is down and a
// retry may pass. pgx closes the connection when the statement is the
// transaction's first, pipelined with BEGIN, though the server never saw
// anything wrong. Nothing persists, and the next write works.
func TestValueTheDriverCannotEncodeIsNotUnavailable(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		f := r.Feature("encode-test")
		framework.Write(f, "first", func(ctx context.Context, tx *framework.Tx, in quantityInput) (struct{}, error) {
			_, err := tx.Exec(ctx, `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ($1, gen_random_uuid(), 'x', $2::int4)`, tx.TenantID(), in.Quantity)
			return struct{}{}, err
		}, nil)
		framework.Write(f, "second", func(ctx context.Context, tx *framework.Tx, in quantityInput) (struct{}, error) {
			if _, err := tx.Exec(ctx, `SELECT $1::text`, "begun"); err != nil {
				return struct{}{}, err
			}
			_, err := tx.Exec(ctx, `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ($1, gen_random_uuid(), 'x', $2::int4)`, tx.TenantID(), in.Quantity)
			return struct{}{}, err
		}, nil)
	})
	for _, typ := range []string{"encode-test:write:first", "encode-test:write:second"} {
		_, err := b.write(t, callAs("t1", "u-t1"), typ, quantityInput{Quantity: 3_000_000_000})
		require.Error(t, err, typ)
		require.Equal(t, framework.CodeInternal, framework.ToError(err).Code, "%s: %v", typ, err)
		require.ErrorContains(t, err, "greater than maximum value for int4", typ)
		b.requireNothingPersisted(t)
	}
	b.place(t, "t1", "after")
}

// DatabaseUnreachable tells an outage (retried, a warning) from a failure
// the server answered or a context that ended.
func TestDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, nil)
	_, err := b.db.Pool.Exec(t.Context(), `SELECT * FROM no_such_table`)
	require.Error(t, err)
	require.False(t, framework.DatabaseUnreachable(err), "%v", err)
	require.False(t, framework.DatabaseUnreachable(nil))
	require.False(t, framework.DatabaseUnreachable(fmt.Errorf("pass: %w", context.DeadlineExceeded)))
	require.True(t, framework.DatabaseUnreachable(fmt.Errorf("read batch: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"})))

	cfg, err := pgx.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.Port = 1 // nothing listens there
	_, err = pgx.ConnectConfig(t.Context(), cfg)
	require.Error(t, err)
	require.True(t, framework.DatabaseUnreachable(fmt.Errorf("acquire: %w", err)), "%v", err)
}

// A connection asked for a second statement while the first one's rows are
// still open answers "conn busy": a bug in the code that shares it, not an
// outage. pgx marks that error safe to retry (nothing was sent), which
// must not make it pass for an unreachable database: the dispatcher would
// log the bug as a WARN outage, and retrying never cures it.
func TestDatabaseUnreachableIsNotAConnectionInUse(t *testing.T) {
	t.Parallel()
	conn, err := pgx.Connect(t.Context(), kumikotest.AdminURL())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(t.Context(), `SELECT generate_series(1, 3)`)
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), `SELECT 1`)
	rows.Close()
	require.ErrorContains(t, err, "conn busy")
	require.True(t, pgconn.SafeToRetry(err), "the premise: pgx calls it safe to retry")
	require.False(t, framework.DatabaseUnreachable(fmt.Errorf("pass: %w", err)), "%v", err)
	require.NoError(t, conn.Ping(t.Context()), "the database was reachable all along")
}

// A connect the server refuses for the process's own configuration (a
// role or database that does not exist, a password or pg_hba rule that
// no longer lets it in) is a failure the database answered, not an
// outage: the server is up and the failure does not pass by itself. It
// comes as a FATAL error, like a restart's shutdown, but must not be
// logged as a WARN outage (README: ERROR "dispatcher pass failed" is kept
// for failures the database answered).
func TestDatabaseUnreachableIsNotARefusedLogin(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]func(*pgx.ConnConfig){
		"unknown role":     func(c *pgx.ConnConfig) { c.User = "kumiko_no_such_role" },
		"unknown database": func(c *pgx.ConnConfig) { c.Database = "kumiko_no_such_database" },
	} {
		cfg, err := pgx.ParseConfig(kumikotest.AdminURL())
		require.NoError(t, err)
		change(cfg)
		_, err = pgx.ConnectConfig(t.Context(), cfg)
		require.Error(t, err, name)
		pgErr, ok := errors.AsType[*pgconn.PgError](err)
		require.True(t, ok, "%s: %v", name, err)
		require.Equal(t, "FATAL", pgErr.Severity, name)
		require.False(t, framework.DatabaseUnreachable(fmt.Errorf("dispatcher: acquire: %w", err)), "%s: %v", name, err)
	}
	// A server that is starting up or shutting down is still an outage.
	require.True(t, framework.DatabaseUnreachable(&pgconn.PgError{Severity: "FATAL", Code: "57P03"}))
	require.True(t, framework.DatabaseUnreachable(&pgconn.PgError{Severity: "FATAL", Code: "53300"}))
}
