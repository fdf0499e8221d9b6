// Package migrate applies Kumiko's embedded SQL migrations with goose, under
// goose's Postgres session advisory lock, so concurrent processes starting at
// the same time migrate a database exactly once.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/kumiko-go/kumiko/migrations"
)

// Status is one migration's state in the database.
type Status struct {
	// Version is the migration's number (the file name's prefix).
	Version int64
	// Name is the migration's file name.
	Name string
	// Applied reports whether the migration has run.
	Applied bool
}

// sessionLocker is goose's Postgres session lock, on goose's key
// (lock.DefaultLockID, so it excludes older binaries that take it with
// goose's own locker), taken differently: goose's locker probes every 5 s
// and gives up after 5 minutes, so a migrator that found another one
// running a long migration failed with "failed to acquire lock". This one
// probes every lockProbeInterval for as long as its context lets it, so it
// goes on almost the moment the lock is free, and says that it waits, and
// for which backend, on log (nil: silently). It probes rather than blocks
// in pg_advisory_lock: a blocking query cut by the context breaks the
// connection, and goose then reports that as well.
type sessionLocker struct {
	log *slog.Logger
}

// lockProbeInterval is how often a waiting migrator tries the lock.
const lockProbeInterval = 200 * time.Millisecond

const (
	tryLockSQL = `SELECT pg_try_advisory_lock($1)`
	unlockSQL  = `SELECT pg_advisory_unlock($1)`
	// lockHolderSQL finds the backend holding a bigint advisory lock key
	// (below 2^32: classid 0, objid the key, objsubid 1) in this database.
	lockHolderSQL = `SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND classid = 0 AND objid = $1 AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
LIMIT 1`
)

// SessionLock takes the lock on conn, waiting for it when another session
// holds it, until ctx ends.
func (l sessionLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	for waited := false; ; waited = true {
		var ok bool
		if err := conn.QueryRowContext(ctx, tryLockSQL, lock.DefaultLockID).Scan(&ok); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("wait for the migration lock: %w", ctx.Err())
			}
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if ok {
			return nil
		}
		if !waited && l.log != nil {
			var pid int64
			if err := conn.QueryRowContext(ctx, lockHolderSQL, lock.DefaultLockID).Scan(&pid); err != nil {
				pid = 0 // let go meanwhile
			}
			l.log.WarnContext(ctx, "waiting for the migration lock held by another session", "holder_pid", pid)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the migration lock: %w", ctx.Err())
		case <-time.After(lockProbeInterval):
		}
	}
}

// SessionUnlock lets go of the lock on conn.
func (l sessionLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var ok bool
	if err := conn.QueryRowContext(ctx, unlockSQL, lock.DefaultLockID).Scan(&ok); err != nil {
		return fmt.Errorf("release the migration lock: %w", err)
	}
	if !ok {
		return errors.New("release the migration lock: this session did not hold it")
	}
	return nil
}

// newProvider builds a goose provider over the pool, with the session
// locker when locked (Up) and without it for reading the state (List,
// Check): goose's status takes the lock otherwise, so a readiness probe
// would fail while a migration runs (and overlapping probes each other).
func newProvider(pool *pgxpool.Pool, fsys fs.FS, logger *slog.Logger, locked bool) (*goose.Provider, func() error, error) {
	if fsys == nil {
		fsys = migrations.FS
	}
	var opts []goose.ProviderOption
	if locked {
		opts = append(opts, goose.WithSessionLocker(sessionLocker{log: logger}))
	}
	db := stdlib.OpenDBFromPool(pool)
	if logger != nil {
		opts = append(opts, goose.WithSlog(logger))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, opts...)
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("migrate: provider: %w", err)
	}
	return p, db.Close, nil
}

// Up applies every pending migration of fsys (nil means Kumiko's embedded
// migrations) and returns how many ran. logger may be nil.
func Up(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, logger *slog.Logger) (int, error) {
	applied, err := Apply(ctx, pool, fsys, logger)
	return len(applied), err
}

// Apply is [Up] that returns the migrations it applied, in order (none
// when nothing was pending). On failure it returns those applied before
// the failing one together with the error, a *[FailedError] when a
// migration failed. A migration cut short because ctx ended did not fail:
// the error then wraps ctx's error (context.Canceled or
// context.DeadlineExceeded) and is no *[FailedError]. logger may be nil.
func Apply(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, logger *slog.Logger) ([]Status, error) {
	p, closeDB, err := newProvider(pool, fsys, logger, true)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	res, err := p.Up(ctx)
	var pe *goose.PartialError
	if errors.As(err, &pe) {
		res = pe.Applied
	}
	out := make([]Status, 0, len(res))
	for _, r := range res {
		out = append(out, Status{Version: r.Source.Version, Name: r.Source.Path, Applied: true})
	}
	if pe != nil && pe.Failed != nil && pe.Failed.Source != nil {
		if ctx.Err() != nil {
			// Stopped, not failed: the caller went away (a client that hung
			// up, Ctrl-C). The migration's transaction rolled back; running
			// up again applies it (a "+goose NO TRANSACTION" one may have left
			// part of its work).
			return out, fmt.Errorf("migrate: up: migration %s stopped (%d applied before it): %w",
				pe.Failed.Source.Path, len(out), ctx.Err())
		}
		return out, &FailedError{Applied: out, Failed: Status{Version: pe.Failed.Source.Version, Name: pe.Failed.Source.Path}, Err: pe.Err}
	}
	if err != nil {
		return out, fmt.Errorf("migrate: up: %w", err)
	}
	return out, nil
}

// FailedError is [Apply]'s error when a migration failed: the database
// holds the migrations applied before it, and nothing of the failed one
// (each runs in its own transaction, unless it is marked "+goose NO
// TRANSACTION"); it stays pending.
type FailedError struct {
	// Applied are the migrations this run applied before the failure.
	Applied []Status
	// Failed is the migration that failed.
	Failed Status
	// Err is its error (the database's, for an SQL migration).
	Err error
}

// Error names the failed migration, its error and how many were applied.
func (e *FailedError) Error() string {
	return fmt.Sprintf("migrate: up: migration %s failed (%d applied before it): %v", e.Failed.Name, len(e.Applied), e.Err)
}

// Unwrap returns the migration's error.
func (e *FailedError) Unwrap() error { return e.Err }

// versionTableSQL tells whether goose's version table exists, resolved on
// the search path as goose's own statements resolve it.
const versionTableSQL = `SELECT to_regclass('goose_db_version') IS NOT NULL`

// versionTableExists reports whether goose's version table exists, so that
// a read of the state asks goose nothing on a database never migrated:
// goose creates its table on any call, its status too.
func versionTableExists(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	var exists bool
	if err := pool.QueryRow(ctx, versionTableSQL).Scan(&exists); err != nil {
		return false, err
	}
	return exists, nil
}

// List reports the state of every migration of fsys (nil means Kumiko's
// embedded migrations). It does not wait for a migration that is running:
// what it reports is what has committed. It writes nothing: on a database
// never migrated (no goose version table) it reports every migration
// pending and leaves the table to the first [Apply].
func List(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) ([]Status, error) {
	p, closeDB, err := newProvider(pool, fsys, nil, false)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	exists, err := versionTableExists(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("migrate: status: %w", err)
	}
	if !exists {
		srcs := p.ListSources()
		out := make([]Status, 0, len(srcs))
		for _, s := range srcs {
			out = append(out, Status{Version: s.Version, Name: s.Path})
		}
		return out, nil
	}
	sts, err := p.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: status: %w", err)
	}
	out := make([]Status, 0, len(sts))
	for _, s := range sts {
		out = append(out, Status{Version: s.Source.Version, Name: s.Source.Path, Applied: s.State == goose.StateApplied})
	}
	return out, nil
}

// unknownSQL lists the versions whose latest row in goose's version table
// marks them applied (goose's legacy down inserted a row not applied).
// The zero version is goose's own bookkeeping row.
const unknownSQL = `SELECT version_id FROM (
	SELECT DISTINCT ON (version_id) version_id, is_applied
	FROM goose_db_version ORDER BY version_id, id DESC) v
WHERE is_applied AND version_id > 0 ORDER BY version_id`

// Unknown returns, in ascending order, the versions applied in the database
// that fsys (nil means Kumiko's embedded migrations) does not have: those of
// a newer release, when a binary runs on a schema that was migrated past
// it. goose's own reports (List, Check, Up) only look at the binary's
// migrations, so such a database looks fully applied to them. A database
// without goose's version table (never migrated) has none.
func Unknown(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) ([]int64, error) {
	p, closeDB, err := newProvider(pool, fsys, nil, false)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	known := make(map[int64]bool)
	for _, s := range p.ListSources() {
		known[s.Version] = true
	}
	exists, err := versionTableExists(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("migrate: unknown versions: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := pool.Query(ctx, unknownSQL)
	if err != nil {
		return nil, fmt.Errorf("migrate: unknown versions: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("migrate: unknown versions: %w", err)
	}
	var out []int64
	for _, v := range applied {
		if !known[v] {
			out = append(out, v)
		}
	}
	return out, nil
}

// ErrPending is returned by Check when migrations are still to be applied.
var ErrPending = errors.New("migrate: migrations pending")

// Check returns nil when every migration of fsys (nil means Kumiko's embedded
// ones) is applied, ErrPending when some are not, or the error that stopped
// the check. Readiness probes call it; like [List], it writes nothing.
func Check(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) error {
	sts, err := List(ctx, pool, fsys)
	if err != nil {
		return err
	}
	for _, s := range sts {
		if !s.Applied {
			return fmt.Errorf("%w: %s", ErrPending, s.Name)
		}
	}
	return nil
}
