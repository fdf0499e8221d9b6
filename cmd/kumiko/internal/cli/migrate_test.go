package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/cmd/kumiko/internal/cli"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// TestConcurrentMigratesCreateTheDatabaseOnce: several `kumiko migrate`
// started at once against a database that does not exist yet (processes
// of a fresh deployment) all succeed: one creates it, the others find it
// created, and the migrations are applied once.
func TestConcurrentMigratesCreateTheDatabaseOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "kumiko")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kumiko-go/kumiko/cmd/kumiko").CombinedOutput()
	require.NoError(t, err, string(out))
	name, admin := unusedDatabase(t, "kumiko_cli_create_")

	const n = 4
	type result struct {
		out string
		err error
	}
	results := make(chan result, n)
	for range n {
		go func() {
			cmd := exec.Command(bin, "migrate")
			cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://postgres@127.0.0.1:5432/"+name+"?sslmode=disable")
			out, err := cmd.CombinedOutput()
			results <- result{string(out), err}
		}()
	}
	applied := 0
	for range n {
		r := <-results
		require.NoError(t, r.err, r.out)
		if !strings.Contains(r.out, "applied 0 ") {
			applied++
		}
	}
	require.Equal(t, 1, applied, "one process applies the migrations")
	var versions int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&versions))
	require.Equal(t, 1, versions)
}

// TestMigrateStatusReportsEventLogAhead: after a dump restored into a new
// cluster (simulated by a superuser UPDATE of a commit key), `kumiko
// migrate status` lists the migrations as before and warns on stderr with
// the pg_resetwal to run; on a healthy log it says nothing more.
func TestMigrateStatusReportsEventLogAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildKumiko(t)
	db := kumikotest.NewDB(t)
	env := []string{"DATABASE_URL=" + db.URL}
	_, err := eventstore.Append(ctx, db.Pool, eventstore.StreamRef{TenantID: "acme", Type: "thing", ID: "1"}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: "restored:event:made", TypeVersion: 1, Payload: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	stdout, stderr, code := runKumiko(t, bin, env, "migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "applied ")
	require.Empty(t, stderr)

	var next uint64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())`).Scan(&next))
	epoch := next>>32 + 2
	_, err = db.Pool.Exec(ctx, `UPDATE events SET commit_key = $1::text::xid8`, fmt.Sprint(epoch<<32|5))
	require.NoError(t, err)
	stdout2, stderr, code := runKumiko(t, bin, env, "migrate", "status")
	require.Equal(t, 0, code, "the migrations' status is still listed")
	require.Equal(t, stdout, stdout2)
	require.Contains(t, stderr, fmt.Sprintf("warning: eventstore: the event log's largest commit key %d ", epoch<<32|5))
	require.Contains(t, stderr, fmt.Sprintf("pg_resetwal -e %d ", epoch+1))
}

// unusedDatabase returns the name of a database that does not exist yet,
// which is dropped when the test ends, and a connection to the server's
// postgres database (closed then) to create it with.
func unusedDatabase(t *testing.T, prefix string) (string, *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		_ = admin.Close(ctx)
	})
	return name, admin
}

// TestMigrateRefusesAnUnknownVerbFirst: `kumiko migrate down` (there is no
// down) says the verb is unknown, whatever the configuration, rather than
// that DATABASE_URL is required or what a connection attempt answered.
func TestMigrateRefusesAnUnknownVerbFirst(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	_, err := execute("migrate", "down")
	require.EqualError(t, err, `unknown migrate verb "down" (want up or status)`)
}

// TestMigrateWarnsOfANewerSchema: against a database that a newer release
// migrated further (a roll back of the binary), `kumiko migrate` and
// `kumiko migrate status` succeed, since the binary's own migrations are
// applied, and say on stderr which versions the binary does not know;
// they said nothing, as if the schema were the binary's.
func TestMigrateWarnsOfANewerSchema(t *testing.T) {
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	t.Setenv("DATABASE_URL", db.URL)
	run := func(args ...string) (string, string, error) {
		root := cli.Root(nil, nil)
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(args)
		err := root.ExecuteContext(ctx)
		return out.String(), errOut.String(), err
	}
	out, errOut, err := run("migrate")
	require.NoError(t, err)
	require.Equal(t, "applied 0 migration(s)\n", out)
	require.Empty(t, errOut)

	_, err = db.Pool.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (99001, true), (99002, true)`)
	require.NoError(t, err)
	const warning = "warning: the database holds migrations this binary does not know (versions 99001, 99002): " +
		"a newer release applied them; this binary's own migrations are applied, and it runs on that schema only if they were additive\n"
	out, errOut, err = run("migrate", "up")
	require.NoError(t, err)
	require.Equal(t, "applied 0 migration(s)\n", out)
	require.Equal(t, warning, errOut)

	out, errOut, err = run("migrate", "status")
	require.NoError(t, err)
	require.Contains(t, out, "applied  00012_tenant_append_guards.sql\n")
	require.NotContains(t, out, "pending")
	require.Equal(t, warning, errOut)
}

// TestMigrateSaysItWaitsForTheLock: `kumiko migrate` against a fresh
// database whose migration lock another session holds (another kumiko
// migrate, started a moment before) says on stderr that it waits and for
// which backend, and migrates once the lock is free; it waited in
// silence, polling every 5 s, and gave up after 5 minutes.
func TestMigrateSaysItWaitsForTheLock(t *testing.T) {
	ctx := context.Background()
	name, _ := unusedDatabase(t, "kumiko_cli_lock_")
	url := "postgres://postgres@127.0.0.1:5432/" + name + "?sslmode=disable"
	admin, err := pgx.Connect(ctx, kumikotest.AdminURL())
	require.NoError(t, err)
	defer func() { _ = admin.Close(ctx) }()
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	holder, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = holder.Close(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lock.DefaultLockID)
	require.NoError(t, err)

	t.Setenv("DATABASE_URL", url)
	root := cli.Root(nil, nil)
	var out, errOut proctest.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs([]string{"migrate"})
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(errOut.String(), "waiting for the migration lock") {
		require.True(t, time.Now().Before(deadline), "no word that it waits: %q", errOut.String())
		time.Sleep(20 * time.Millisecond)
	}
	require.Contains(t, errOut.String(), fmt.Sprintf(`"holder_pid":%d`, holder.PgConn().PID()))
	require.Empty(t, out.String())
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lock.DefaultLockID)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Regexp(t, `^applied [1-9][0-9]* migration\(s\)\n$`, out.String())
}

// newEmptyDatabase creates a database with nothing in it (never migrated),
// dropped when the test ends, and returns its URL and an admin connection
// to the server's postgres database.
func newEmptyDatabase(t *testing.T, prefix string) (string, *pgx.Conn) {
	t.Helper()
	name, admin := unusedDatabase(t, prefix)
	_, err := admin.Exec(context.Background(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	return "postgres://postgres@127.0.0.1:5432/" + name + "?sslmode=disable", admin
}

// TestMigrateStatusWritesNothing: `kumiko migrate status` on a database
// never migrated lists every migration pending and leaves the database as
// it was; it created goose's version table, so a look changed what it
// looked at.
func TestMigrateStatusWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildKumiko(t)
	url, _ := newEmptyDatabase(t, "kumiko_cli_status_")
	stdout, stderr, code := runKumiko(t, bin, []string{"DATABASE_URL=" + url}, "migrate", "status")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	require.Contains(t, stdout, "pending  00001_")
	require.NotContains(t, stdout, "applied")

	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "migrate status created goose's version table")
}

// migrateStatusJSON is `kumiko migrate status --json`'s output.
type migrateStatusJSON struct {
	Migrations []struct {
		Version int64  `json:"version"`
		Name    string `json:"name"`
		State   string `json:"state"`
	} `json:"migrations"`
	Pending int     `json:"pending"`
	Unknown []int64 `json:"unknown"`
}

// TestMigrateStatusForScripts: `kumiko migrate status --json` prints the
// migrations' state as one JSON object, and `--check` exits 2 while a
// migration is pending (1 stays for errors), so that a deploy script can
// tell "migrate first" from "the check failed"; without --check the
// status exits 0 with pending migrations, as before. Both flags belong to
// status only: `kumiko migrate --check` (up is the default verb) is
// refused before it touches the database rather than migrating it.
func TestMigrateStatusForScripts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildKumiko(t)
	url, _ := newEmptyDatabase(t, "kumiko_cli_check_")
	env := []string{"DATABASE_URL=" + url}

	for _, args := range [][]string{{"migrate", "--check"}, {"migrate", "up", "--json"}} {
		stdout, stderr, code := runKumiko(t, bin, env, args...)
		requireRefused(t, stdout, stderr, code, "--json and --check apply to kumiko migrate status only")
	}
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(ctx) }()
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('goose_db_version') IS NOT NULL`).Scan(&exists))
	require.False(t, exists, "a refused command migrated")

	stdout, stderr, code := runKumiko(t, bin, env, "migrate", "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	var st migrateStatusJSON
	require.NoError(t, json.Unmarshal([]byte(stdout), &st), stdout)
	require.NotEmpty(t, st.Migrations)
	require.Equal(t, len(st.Migrations), st.Pending)
	require.Equal(t, int64(1), st.Migrations[0].Version)
	require.Equal(t, "00001_event_log.sql", st.Migrations[0].Name)
	require.Equal(t, "pending", st.Migrations[0].State)
	require.NotNil(t, st.Unknown, "an empty list, not null")
	require.Empty(t, st.Unknown)

	stdout, stderr, code = runKumiko(t, bin, env, "migrate", "status", "--check")
	require.Equal(t, 2, code)
	require.Contains(t, stdout, "pending  00001_event_log.sql\n")
	require.Equal(t, fmt.Sprintf("kumiko: %d migration(s) pending: run kumiko migrate\n", st.Pending), stderr)

	_, stderr, code = runKumiko(t, bin, env, "migrate")
	require.Equal(t, 0, code, stderr)
	stdout, stderr, code = runKumiko(t, bin, env, "migrate", "status", "--check", "--json")
	require.Equal(t, 0, code, stderr)
	require.Empty(t, stderr)
	st = migrateStatusJSON{}
	require.NoError(t, json.Unmarshal([]byte(stdout), &st), stdout)
	require.Zero(t, st.Pending)
	for _, m := range st.Migrations {
		require.Equal(t, "applied", m.State, m.Name)
	}

	// A newer release's migration: listed as unknown, and no failure of
	// the check (the binary's own migrations are applied).
	_, err = conn.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (99001, true)`)
	require.NoError(t, err)
	stdout, stderr, code = runKumiko(t, bin, env, "migrate", "status", "--check", "--json")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "warning: the database holds migrations this binary does not know (version 99001)")
	st = migrateStatusJSON{}
	require.NoError(t, json.Unmarshal([]byte(stdout), &st), stdout)
	require.Equal(t, []int64{99001}, st.Unknown)

	// Pending once more (a migration undone): exit 2 with --json too.
	_, err = conn.Exec(ctx, `DELETE FROM goose_db_version WHERE version_id = (SELECT max(version_id) FROM goose_db_version WHERE version_id < 99000)`)
	require.NoError(t, err)
	stdout, stderr, code = runKumiko(t, bin, env, "migrate", "status", "--check", "--json")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "kumiko: 1 migration(s) pending: run kumiko migrate\n")
	st = migrateStatusJSON{}
	require.NoError(t, json.Unmarshal([]byte(stdout), &st), stdout)
	require.Equal(t, 1, st.Pending)
}
