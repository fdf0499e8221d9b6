// Package kumikotest gives tests of Kumiko and of feature code real,
// isolated Postgres databases and Redis key spaces.
//
// Each [NewDB] call clones a fresh database from a template that was migrated
// once (per set of migration files), which takes tens of milliseconds, so
// tests run with t.Parallel(). The server is taken from KUMIKO_TEST_DATABASE_URL,
// default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable.
//
// Clones are dropped when their test ends. A test process that never got
// there (killed, interrupted, timed out) leaves its clones behind; the next
// process to create a clone on the server drops them, and the templates of
// migration sets no process used for [TemplateIdleDays] days.
package kumikotest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Migrations returns Kumiko's embedded migrations as a set a test can add
// its own to (for [NewDBFrom], or a process's migrations).
func Migrations(t testing.TB) fstest.MapFS {
	t.Helper()
	set := fstest.MapFS{}
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return err
		}
		data, err := fs.ReadFile(migrations.FS, path)
		set[path] = &fstest.MapFile{Data: data}
		return err
	})
	if err != nil {
		t.Fatalf("kumikotest: read the migrations: %v", err)
	}
	return set
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
	owner, err := processOwner(ctx)
	if err != nil {
		return nil, nil, err
	}
	name := cloneName(owner)
	admin, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return nil, nil, fmt.Errorf("connect admin: %w", err)
	}
	defer admin.Close(ctx)
	sweepOnce.Do(func() { sweep(ctx, admin, owner) })
	tmpl, err := ensureTemplate(ctx, fsys)
	if err != nil {
		return nil, nil, fmt.Errorf("template: %w", err)
	}
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, name, tmpl))
		var pgErr *pgconn.PgError
		switch {
		case err == nil || attempt > 50:
		case strings.Contains(err.Error(), "being accessed"):
			// CREATE DATABASE ... TEMPLATE fails while another session
			// touches the template; retry briefly.
			time.Sleep(100 * time.Millisecond)
			continue
		case errors.As(err, &pgErr) && pgErr.Code == "3D000":
			// invalid_catalog_name: the template was swept meanwhile by
			// another process; make it again.
			if tmpl, err = ensureTemplate(ctx, fsys); err != nil {
				return nil, nil, fmt.Errorf("template: %w", err)
			}
			continue
		}
		break
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
		markUsed(ctx, admin, tmpl)
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
	markUsed(ctx, admin, tmpl)
	return tmpl, nil
}

// templateUsePrefix starts the comment of a template database, followed by
// the Unix time a process last used it.
const templateUsePrefix = "kumiko template, last used "

// TemplateIdleDays is how long a template no process used is kept.
const TemplateIdleDays = 7

// markUsed records in tmpl's comment that it is in use now (once an hour
// at most, so that parallel test processes do not queue on the catalog).
// A failure (a user that does not own the template) only means that the
// template may be swept while in use, and made again.
func markUsed(ctx context.Context, admin *pgx.Conn, tmpl string) {
	var comment *string
	if admin.QueryRow(ctx, `SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = $1`,
		tmpl).Scan(&comment) != nil {
		return
	}
	now := time.Now()
	if comment != nil {
		if at, ok := lastUse(*comment); ok && now.Sub(at) < time.Hour {
			return
		}
	}
	text := templateUsePrefix + strconv.FormatInt(now.Unix(), 10)
	_, _ = admin.Exec(ctx, fmt.Sprintf(`COMMENT ON DATABASE %s IS '%s'`, tmpl, text))
}

// lastUse reads the time a template comment records.
func lastUse(comment string) (time.Time, bool) {
	sec, err := strconv.ParseInt(strings.TrimPrefix(comment, templateUsePrefix), 10, 64)
	if err != nil || !strings.HasPrefix(comment, templateUsePrefix) {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// ownerLockClass is the class of the session advisory locks (in the
// maintenance database) that mark the processes owning clones: a clone
// whose owner's lock is free belongs to a process that is gone.
const ownerLockClass = 7275302

// owner is this process's owner id and the session holding its lock, open
// for the life of the process.
var owner struct {
	mu   sync.Mutex
	id   int32
	conn *pgx.Conn
}

// sweepOnce sweeps the server at most once per process.
var sweepOnce sync.Once

// processOwner returns this process's owner id, taking its lock on the
// first call (and again after the session holding it broke).
func processOwner(ctx context.Context) (int32, error) {
	owner.mu.Lock()
	defer owner.mu.Unlock()
	if owner.conn != nil && !owner.conn.IsClosed() {
		return owner.id, nil
	}
	conn, err := pgx.Connect(ctx, AdminURL())
	if err != nil {
		return 0, fmt.Errorf("connect admin: %w", err)
	}
	for i := range 100 {
		id := int32(randomUint32() & 0x7fffffff)
		if i == 0 && owner.id != 0 {
			id = owner.id // a broken session: keep the name of our clones
		}
		var got bool
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, ownerLockClass, id).Scan(&got); err != nil {
			_ = conn.Close(ctx)
			return 0, fmt.Errorf("owner lock: %w", err)
		}
		if got {
			owner.id, owner.conn = id, conn
			return id, nil
		}
	}
	_ = conn.Close(ctx)
	return 0, errors.New("owner lock: no free owner id")
}

// cloneRE matches the name of a clone: its owner id, then a random part.
var cloneRE = regexp.MustCompile(`^kumiko_t_([0-9a-f]{8})_[0-9a-f]{16}$`)

// cloneName returns a new clone name of owner.
func cloneName(owner int32) string {
	return fmt.Sprintf("kumiko_t_%08x_%s", uint32(owner), randomHex(8))
}

// sweep drops the clones whose owner process is gone, and the templates no
// process used for TemplateIdleDays. A database someone is connected to is
// left alone (DROP without FORCE fails on it). Failures are ignored: a
// sweep only tidies up.
func sweep(ctx context.Context, admin *pgx.Conn, self int32) {
	rows, err := admin.Query(ctx, `SELECT datname, datistemplate, coalesce(shobj_description(oid, 'pg_database'), '')
		FROM pg_database WHERE datname LIKE 'kumiko\_t\_%' OR datname LIKE 'kumiko\_tmpl\_%'`)
	if err != nil {
		return
	}
	type db struct {
		name, comment string
		template      bool
	}
	var dbs []db
	for rows.Next() {
		var d db
		if rows.Scan(&d.name, &d.template, &d.comment) == nil {
			dbs = append(dbs, d)
		}
	}
	rows.Close()
	for _, d := range dbs {
		if m := cloneRE.FindStringSubmatch(d.name); m != nil {
			id, _ := strconv.ParseUint(m[1], 16, 32)
			if int32(id) != self {
				dropOrphan(ctx, admin, d.name, int32(id))
			}
			continue
		}
		if !d.template {
			continue
		}
		switch at, ok := lastUse(d.comment); {
		case !ok:
			// Made before templates recorded their use: from now on.
			markUsed(ctx, admin, d.name)
		case time.Since(at) > TemplateIdleDays*24*time.Hour:
			dropIdleTemplate(ctx, admin, d.name)
		}
	}
}

// dropOrphan drops clone when its owner's lock is free, holding that lock
// meanwhile so that no new process takes the owner id.
func dropOrphan(ctx context.Context, admin *pgx.Conn, clone string, id int32) {
	var free bool
	if inUse(ctx, admin, clone) ||
		admin.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, ownerLockClass, id).Scan(&free) != nil || !free {
		return
	}
	_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s`, clone))
	_, _ = admin.Exec(ctx, `SELECT pg_advisory_unlock($1, $2)`, ownerLockClass, id)
}

// inUse reports whether a session is connected to db (or that it cannot
// tell): DROP DATABASE would wait 5 s for it before failing.
func inUse(ctx context.Context, admin *pgx.Conn, db string) bool {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1`, db).Scan(&n)
	return err != nil || n > 0
}

// dropIdleTemplate drops an idle template under the template lock, so that
// no process is making it or cloning from it meanwhile (a clone that finds
// it gone makes it again).
func dropIdleTemplate(ctx context.Context, admin *pgx.Conn, tmpl string) {
	if inUse(ctx, admin, tmpl) {
		return
	}
	if _, err := admin.Exec(ctx, `SELECT pg_advisory_lock(7275301)`); err != nil {
		return
	}
	defer func() { _, _ = admin.Exec(context.Background(), `SELECT pg_advisory_unlock(7275301)`) }()
	if _, err := admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s IS_TEMPLATE false`, tmpl)); err != nil {
		return
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s`, tmpl)); err != nil {
		// In use: a template again, for whoever uses it.
		_, _ = admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s IS_TEMPLATE true`, tmpl))
	}
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

func randomUint32() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
