// Package kumikotest gives tests of Kumiko and of feature code real,
// isolated Postgres databases and Redis key spaces.
//
// Each [NewDB] call clones a fresh database from a template that was migrated
// once (per set of migration files), which takes tens of milliseconds, so
// tests run with t.Parallel(). The server is taken from KUMIKO_TEST_DATABASE_URL,
// default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
package kumikotest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/migrations"
)

// DefaultAdminURL is the server used when KUMIKO_TEST_DATABASE_URL is unset.
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// AdminURL returns the maintenance-database URL tests create databases with.
func AdminURL() string {
	if u := os.Getenv("KUMIKO_TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultAdminURL
}

// DB is one fresh, migrated database owned by a test.
type DB struct {
	// Name is the database's name.
	Name string
	// URL connects to it.
	URL string
	// Pool is a pool on it, closed when the test ends.
	Pool *pgxpool.Pool
}

// WaitVisible waits, up to 30 s, until every event written so far lies
// below the visibility horizon, so that a dispatcher pass can reach it.
// Transactions in other databases of the same server (parallel test
// packages) hold that horizon back for a moment; a test that counts what
// one pass delivers waits for this first.
func (db *DB) WaitVisible(t testing.TB) {
	t.Helper()
	const q = `SELECT count(*) FROM events WHERE commit_key >= pg_snapshot_xmin(pg_current_snapshot())`
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int64
		if err := db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
			t.Fatalf("kumikotest: wait for visible events: %v", err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kumikotest: %d events did not become visible within 30 s", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// NewDB creates a database cloned from the migrated template of Kumiko's
// embedded migrations and drops it when the test ends.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return NewDBFrom(t, migrations.FS)
}

// NewDBFrom is [NewDB] for another migration set (a template per set).
func NewDBFrom(t testing.TB, fsys fs.FS) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, _, err := CreateDB(ctx, fsys)
	if err != nil {
		t.Fatalf("kumikotest: %v", err)
	}
	t.Cleanup(func() { closeAndDrop(t, db, 30*time.Second) })
	return db
}

// closeAndDrop closes db's pool and drops the database. pgxpool's Close
// waits for every acquired connection: a test that stopped at a failed
// assertion while holding a transaction would block it forever, and hang the
// whole package until go test's timeout instead of reporting that failure.
// So the wait is bounded (to 2 s after a failure); a connection still held
// after wait in a passing test is a leak and fails it. The database is
// dropped in any case, which ends the held connection's backend.
func closeAndDrop(t testing.TB, db *DB, wait time.Duration) {
	closed := make(chan struct{})
	go func() { db.Pool.Close(); close(closed) }()
	if t.Failed() {
		wait = min(wait, 2*time.Second)
	}
	select {
	case <-closed:
	case <-time.After(wait):
		if !t.Failed() {
			t.Errorf("kumikotest: a connection to %s was not released within %s of the test's end (a transaction left open?)", db.Name, wait)
		}
	}
	dropDatabase(db.Name)
}

// CreateDB creates a database cloned from the migrated template of fsys
// (nil: Kumiko's embedded migrations) outside of a test (benchmarks, tools).
// drop closes the pool and drops the database.
func CreateDB(ctx context.Context, fsys fs.FS) (db *DB, drop func(), err error) {
	if fsys == nil {
		fsys = migrations.FS
	}
	tmpl, err := ensureTemplate(ctx, fsys)
	if err != nil {
		return nil, nil, fmt.Errorf("template: %w", err)
	}
	name := "kumiko_t_" + randomHex(8)
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return nil, nil, fmt.Errorf("connect admin: %w", err)
	}
	defer admin.Close(ctx)
	// CREATE DATABASE ... TEMPLATE fails while another session touches the
	// template; retry briefly.
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, tmpl))
		if err == nil || attempt > 50 || !strings.Contains(err.Error(), "being accessed") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("create database: %w", err)
	}
	dbURL := WithDatabase(AdminURL(), name)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		dropDatabase(name)
		return nil, nil, fmt.Errorf("pool: %w", err)
	}
	return &DB{Name: name, URL: dbURL, Pool: pool}, func() {
		pool.Close()
		dropDatabase(name)
	}, nil
}

// dropDatabase removes a test database, disconnecting whoever is left.
func dropDatabase(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return
	}
	defer admin.Close(ctx)
	_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name))
}

// WithDatabase returns the connection string base with its database
// replaced by name: the path of a URL (dropping `dbname` and `database`
// query parameters, which would override it), or a `dbname` keyword
// appended to a keyword/value string (the last one wins).
func WithDatabase(base, name string) string {
	if !strings.Contains(base, "://") {
		return strings.TrimSpace(base) + " dbname=" + name
	}
	u, err := url.Parse(base)
	if err != nil {
		return base // pgx fails on it too, at the first connection
	}
	u.Path = "/" + name
	q := u.Query()
	q.Del("dbname")
	q.Del("database")
	u.RawQuery = q.Encode()
	return u.String()
}

// ensureTemplate creates (once per migration set, across processes) a
// database migrated with fsys and marked as a template.
func ensureTemplate(ctx context.Context, fsys fs.FS) (string, error) {
	sum, err := hashFS(fsys)
	if err != nil {
		return "", err
	}
	tmpl := "kumiko_tmpl_" + sum[:16]
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return "", fmt.Errorf("connect admin: %w", err)
	}
	defer admin.Close(ctx)
	// A session advisory lock in the maintenance database serialises
	// template creation across test processes.
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(7275301)`); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer func() { _, _ = admin.Exec(context.Background(), `SELECT pg_advisory_unlock(7275301)`) }()
	var ready bool
	err = admin.QueryRow(ctx, `SELECT datistemplate FROM pg_database WHERE datname = $1`, tmpl).Scan(&ready)
	if err == nil && ready {
		return tmpl, nil
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, tmpl)); err != nil {
		return "", fmt.Errorf("drop stale template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s`, tmpl)); err != nil {
		return "", fmt.Errorf("create template: %w", err)
	}
	pool, err := pgxpool.New(ctx, WithDatabase(AdminURL(), tmpl))
	if err != nil {
		return "", fmt.Errorf("template pool: %w", err)
	}
	_, err = migrate.Up(ctx, pool, fsys, nil)
	pool.Close()
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s IS_TEMPLATE true`, tmpl)); err != nil {
		return "", fmt.Errorf("mark template: %w", err)
	}
	return tmpl, nil
}

// hashFS fingerprints every file of a migration set.
func hashFS(fsys fs.FS) (string, error) {
	h := sha256.New()
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
