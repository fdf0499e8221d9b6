package kumikotest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// recordingTB records what closeAndDrop reports instead of failing the test.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	errors []string
}

func (r *recordingTB) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n))
	return n == 1
}

// A connection left acquired (a transaction a failed assertion abandoned)
// must not hang the cleanup: it reports the leak in a passing test, stays
// quiet after a failure, and drops the database either way.
func TestCloseAndDropDoesNotHangOnAHeldConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, alreadyFailed := range []bool{false, true} {
		db, _, err := CreateDB(ctx, nil)
		require.NoError(t, err)
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)

		rec := &recordingTB{TB: t, failed: alreadyFailed}
		start := time.Now()
		closeAndDrop(rec, db, 300*time.Millisecond)
		require.Less(t, time.Since(start), 20*time.Second)
		if alreadyFailed {
			require.Empty(t, rec.errors)
		} else {
			require.Len(t, rec.errors, 1)
			require.Contains(t, rec.errors[0], "was not released")
		}
		require.False(t, databaseExists(t, db.Name))
		_ = tx.Rollback(ctx) // its backend is gone; this returns the connection and ends Close
	}

	// Without a held connection nothing is reported.
	db, _, err := CreateDB(ctx, nil)
	require.NoError(t, err)
	rec := &recordingTB{TB: t}
	closeAndDrop(rec, db, 300*time.Millisecond)
	require.Empty(t, rec.errors)
	require.False(t, databaseExists(t, db.Name))
}

// WithDatabase points every form of connection string at the named
// database: a `dbname` or `database` query parameter would otherwise win
// over the URL's path (and tests would write into that database), and a
// keyword/value string has no path at all.
func TestWithDatabaseOverridesEveryForm(t *testing.T) {
	t.Parallel()
	for _, base := range []string{
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"postgres://postgres@127.0.0.1:5432/?dbname=postgres&sslmode=disable",
		"postgresql://u:p%40ss@db.example.com/app?database=postgres",
		"host=127.0.0.1 user=postgres dbname=postgres sslmode=disable",
	} {
		cfg, err := pgx.ParseConfig(WithDatabase(base, "kumiko_t_x"))
		require.NoError(t, err, base)
		require.Equal(t, "kumiko_t_x", cfg.Database, base)
	}
}

// helperHoldEnv makes TestHelperHoldsClone, run in a child process, create
// a clone, print its name and wait to be killed.
const helperHoldEnv = "KUMIKO_TEST_HELPER_HOLD_CLONE"

func TestHelperHoldsClone(t *testing.T) {
	if os.Getenv(helperHoldEnv) == "" {
		t.Skip("a child process of TestSweepDropsClonesOfKilledProcesses")
	}
	db, _, err := CreateDB(context.Background(), nil)
	require.NoError(t, err)
	fmt.Println("clone", db.Name)
	select {}
}

// A test process killed before its cleanups leaves its clones behind; the
// next process's sweep drops them, but never the clones of a live process.
func TestSweepDropsClonesOfKilledProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	self, err := processOwner(ctx)
	require.NoError(t, err)

	child := exec.Command(os.Args[0], "-test.run=^TestHelperHoldsClone$", "-test.v")
	child.Env = append(os.Environ(), helperHoldEnv+"=1")
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	var name string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "clone" {
			name = f[1]
			break
		}
	}
	require.NotEmpty(t, name, "the child printed no clone")
	t.Cleanup(func() { dropDatabase(name) })

	admin, err := pgx.Connect(ctx, AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	sweep(ctx, admin, self)
	require.True(t, databaseExists(t, name), "a live process's clone was swept")

	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	_ = child.Wait()
	// The killed process's sessions end a moment after its sockets close.
	require.Eventually(t, func() bool {
		sweep(ctx, admin, self)
		return !databaseExists(t, name)
	}, 20*time.Second, 100*time.Millisecond, "the killed process's clone was not swept")
}

// Templates no process used for TemplateIdleDays are dropped, unless
// someone is connected to them; recently used ones stay.
func TestSweepDropsIdleTemplates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	mk := func(age time.Duration) string {
		name := "kumiko_tmpl_test" + randomHex(6)
		_, err := admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s`, name))
		require.NoError(t, err)
		t.Cleanup(func() {
			// admin is closed by now.
			c, err := pgx.Connect(context.Background(), AdminURL())
			if err == nil {
				_, _ = c.Exec(context.Background(), fmt.Sprintf(`ALTER DATABASE %s IS_TEMPLATE false`, name))
				_ = c.Close(context.Background())
			}
			dropDatabase(name)
		})
		_, err = admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s IS_TEMPLATE true`, name))
		require.NoError(t, err)
		used := time.Now().Add(-age).Unix()
		_, err = admin.Exec(ctx, fmt.Sprintf(`COMMENT ON DATABASE %s IS '%s%d'`, name, templateUsePrefix, used))
		require.NoError(t, err)
		return name
	}
	idle := mk((TemplateIdleDays + 1) * 24 * time.Hour)
	recent := mk(24 * time.Hour)
	busy := mk((TemplateIdleDays + 1) * 24 * time.Hour)
	conn, err := pgx.Connect(ctx, WithDatabase(AdminURL(), busy))
	require.NoError(t, err)
	defer conn.Close(ctx)

	// Best effort: a session that touches it (autovacuum) defers the drop
	// to the next sweep.
	require.Eventually(t, func() bool {
		sweep(ctx, admin, 0)
		return !databaseExists(t, idle)
	}, 20*time.Second, 100*time.Millisecond, "an idle template was kept")
	require.True(t, databaseExists(t, recent), "a recently used template was swept")
	require.True(t, databaseExists(t, busy), "a template in use was swept")
	var template bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT datistemplate FROM pg_database WHERE datname = $1`, busy).Scan(&template))
	require.True(t, template, "a template in use lost its template flag")
}
