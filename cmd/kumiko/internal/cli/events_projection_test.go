package cli_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/features/users"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/rebuild"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// TestEventsAndProjectionCommands runs `kumiko events prune` and `kumiko
// projection rebuild` as a real binary (built once) against fresh databases
// holding the sample features' events.
func TestEventsAndProjectionCommands(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kumiko")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kumiko-go/kumiko/cmd/kumiko").CombinedOutput()
	require.NoError(t, err, string(out))
	t.Run("prune", func(t *testing.T) {
		t.Parallel()
		testEventsPrune(t, bin)
	})
	t.Run("rebuild", func(t *testing.T) {
		t.Parallel()
		testProjectionRebuild(t, bin)
	})
	t.Run("prune-handled", func(t *testing.T) {
		t.Parallel()
		testPruneHandled(t, bin)
	})
	t.Run("prune-dead-letters", func(t *testing.T) {
		t.Parallel()
		testPruneDeadLetters(t, bin)
	})
	t.Run("rebuild-killed", func(t *testing.T) {
		t.Parallel()
		testProjectionRebuildKilled(t, bin)
	})
}

// logFixture is a database with the sample features' schema, a registry with
// the sample features (as the binary has them) and a runtime.
type logFixture struct {
	bin string
	db  *kumikotest.DB
	reg *framework.Registry
	ft  *orders.Feature
	rt  *framework.Runtime
}

func newLogFixture(t *testing.T, bin string) *logFixture {
	t.Helper()
	f := &logFixture{bin: bin, db: kumikotest.NewDB(t), reg: framework.NewRegistry()}
	f.ft = orders.Register(f.reg)
	users.Register(f.reg)
	var err error
	f.rt, err = framework.NewRuntime(f.reg, f.db.Pool, nil)
	require.NoError(t, err)
	return f
}

// run runs the binary and returns its combined output and exit code.
func (f *logFixture) run(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, f.bin, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+f.db.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("$ kumiko %s\n%s", strings.Join(args, " "), out)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	}
	require.NoError(t, err, string(out))
	return string(out), 0
}

// place appends n orders:event:placed events (perTx per transaction) for
// tenant, cancelling every cancelEvery-th order (0: none), as the orders
// feature's writes would.
func (f *logFixture) place(t *testing.T, tenant string, n, perTx, cancelEvery int) {
	t.Helper()
	for done := 0; done < n; {
		k := min(perTx, n-done)
		_, err := f.rt.InTx(context.Background(), tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			for i := range k {
				id := uuid.Must(uuid.NewV7()).String()
				s := framework.Stream{Type: orders.StreamType, ID: id}
				p := orders.Placed{OrderID: id, Customer: fmt.Sprintf("c%d", (done+i)%4), AmountCents: int64(100 + done + i)}
				if err := tx.Append(s, framework.NoStream, f.ft.Placed.With(p)); err != nil {
					return err
				}
				if cancelEvery > 0 && (done+i)%cancelEvery == 0 {
					if err := tx.Append(s, 1, f.ft.Cancelled.With(orders.Cancelled{OrderID: id})); err != nil {
						return err
					}
				}
			}
			return nil
		})
		require.NoError(t, err)
		done += k
	}
}

func (f *logFixture) int(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (f *logFixture) strings(t *testing.T, sql string) []string {
	t.Helper()
	rows, err := f.db.Pool.Query(context.Background(), sql)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// live registers the sample projections' state rows (as a starting
// process does) and returns the dispatcher.
func (f *logFixture) live(t *testing.T) *dispatcher.Dispatcher {
	t.Helper()
	d, err := dispatcher.New(f.db.Pool, f.reg, dispatcher.ProjectionConsumers(f.reg, nil), &dispatcher.Config{InstanceID: "cli-test"})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	return d
}

// drain runs passes of the consumer until no event is left after its cursor.
func (f *logFixture) drain(t *testing.T, d *dispatcher.Dispatcher, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		lag := f.int(t, `SELECT count(*) FROM events e, event_consumers c WHERE c.name = $1
			AND (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
			AND (c.event_types IS NULL OR e.type = ANY(c.event_types))`, name)
		if lag == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s did not catch up", name)
		time.Sleep(5 * time.Millisecond)
	}
}

// totalsMatchRecount checks order_totals against a recount from the log.
func (f *logFixture) totalsMatchRecount(t *testing.T) {
	t.Helper()
	got := f.strings(t, `SELECT tenant_id || '/' || customer || '=' || orders || '/' || amount_cents FROM order_totals ORDER BY 1`)
	want := f.strings(t, `SELECT p.tenant_id || '/' || (p.payload->>'customer') || '=' || (count(*) - count(c.position)) || '/' ||
			(sum((p.payload->>'amountCents')::bigint) - coalesce(sum((p.payload->>'amountCents')::bigint) FILTER (WHERE c.position IS NOT NULL), 0))
		FROM events p LEFT JOIN events c ON c.type = 'orders:event:cancelled'
		  AND c.tenant_id = p.tenant_id AND c.stream_type = p.stream_type AND c.stream_id = p.stream_id
		WHERE p.type = 'orders:event:placed'
		GROUP BY p.tenant_id, p.payload->>'customer' ORDER BY 1`)
	require.NotEmpty(t, want)
	require.Equal(t, want, got)
}

func testEventsPrune(t *testing.T, bin string) {
	f := newLogFixture(t, bin)
	ctx := context.Background()
	f.place(t, "acme", 5, 5, 3) // 5 placed, 2 cancelled
	// The sample app's pub/sub types (the default selection), a few events each.
	defaults, err := retention.SelectTypes(f.reg, nil)
	require.NoError(t, err)
	for _, typ := range defaults {
		_, err := eventstore.Append(ctx, f.db.Pool, eventstore.StreamRef{TenantID: "acme", Type: "notice", ID: typ}, eventstore.AnyVersion,
			[]eventstore.NewEvent{{Type: typ, TypeVersion: 1, Payload: []byte(`{}`)}, {Type: typ, TypeVersion: 1, Payload: []byte(`{}`)}})
		require.NoError(t, err)
	}
	_, err = f.db.Pool.Exec(ctx, `UPDATE events SET created_at = now() - interval '40 days'`)
	require.NoError(t, err)
	const orderTypes = "orders:event:placed, orders:event:cancelled"

	out, code := f.run(t, "events", "prune")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "--older-than-days is required")
	for _, days := range []string{"0", "1000001"} {
		out, code = f.run(t, "events", "prune", "--older-than-days", days)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, "must be between 1 and 1000000")
	}
	out, code = f.run(t, "events", "prune", "--older-than-days", "30", "--types", "orders:event:placed,orders:event:nope")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "unknown event type: orders:event:nope")
	require.Equal(t, int64(7), f.int(t, `SELECT count(*) FROM events WHERE type LIKE 'orders:%'`))

	// A consumer this build declares that no process has registered yet
	// (the job trigger: no worker ran) blocks it as if at the start of
	// the log: its first worker will deliver them from there.
	out, code = f.run(t, "events", "prune", "--older-than-days", "30", "--types", orderTypes)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, jobs.ConsumerName+" (not registered yet, starts at the start of the log): 5 unseen")
	require.Contains(t, out, "start the release's workers")
	require.Equal(t, int64(7), f.int(t, `SELECT count(*) FROM events WHERE type LIKE 'orders:%'`))
	// A worker registers it and passes them (its enqueues are no part of
	// this test).
	trigger, err := dispatcher.New(f.db.Pool, f.reg, []dispatcher.Consumer{{Name: jobs.ConsumerName, System: true,
		EventTypes: jobs.For(f.reg).TriggerTypes(),
		Apply:      func(context.Context, *framework.Tx, framework.Envelope) error { return nil }}},
		&dispatcher.Config{InstanceID: "cli-test-worker"})
	require.NoError(t, err)
	require.NoError(t, trigger.Register(ctx))
	f.drain(t, trigger, jobs.ConsumerName)

	// Pre-registered consumers (no pass yet) block the prune of what they read.
	d := f.live(t)
	out, code = f.run(t, "events", "prune", "--older-than-days", "30", "--types", orderTypes)
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "refused")
	require.Contains(t, out, "orders:order-totals (instance __shared__, idle")
	require.NotContains(t, out, "send-welcome-email", "it reads no order event")
	require.Contains(t, out, "kumiko consumer skip")
	require.Contains(t, out, "kumiko consumer disable")
	// A dry run shows the counts and the refusal.
	out, code = f.run(t, "events", "prune", "--older-than-days", "30", "--types", orderTypes, "--dry-run")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "would delete 7 event(s)")
	require.Contains(t, out, "refused")
	require.Equal(t, int64(7), f.int(t, `SELECT count(*) FROM events WHERE type LIKE 'orders:%'`))

	f.drain(t, d, "orders:order-totals")
	out, code = f.run(t, "events", "prune", "--older-than-days", "30", "--types", orderTypes, "--dry-run")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "orders:event:placed")
	require.Contains(t, out, "would delete 7 event(s) (dry run: nothing deleted)")
	require.Equal(t, int64(7), f.int(t, `SELECT count(*) FROM events WHERE type LIKE 'orders:%'`), "a dry run deletes nothing")

	out, code = f.run(t, "events", "prune", "--older-than-days", "30", "--types", orderTypes)
	require.Equal(t, 0, code, out)
	require.Regexp(t, `orders:event:cancelled\s+2\n`, out)
	require.Regexp(t, `orders:event:placed\s+5\n`, out)
	require.Contains(t, out, "deleted 7 event(s)")
	require.Zero(t, f.int(t, `SELECT count(*) FROM events WHERE type LIKE 'orders:%'`))
	require.Equal(t, int64(5), f.int(t, `SELECT count(*) FROM streams WHERE stream_type = 'order'`), "stream rows stay")

	// The default selection: the pub/sub types only.
	out, code = f.run(t, "events", "prune", "--older-than-days", "30")
	require.Equal(t, 0, code, out)
	if len(defaults) == 0 {
		require.Contains(t, out, "nothing to prune")
		return
	}
	for _, typ := range defaults {
		require.Regexp(t, typ+`\s+2\n`, out)
	}
	require.Contains(t, out, fmt.Sprintf("deleted %d event(s)", 2*len(defaults)))
	require.Zero(t, f.int(t, `SELECT count(*) FROM events`))
}

func testProjectionRebuild(t *testing.T, bin string) {
	f := newLogFixture(t, bin)
	ctx := context.Background()
	f.place(t, "acme", 120, 20, 5)
	f.place(t, "globex", 80, 20, 7)
	d := f.live(t)
	f.drain(t, d, "orders:order-totals")
	f.totalsMatchRecount(t)
	events := f.int(t, `SELECT count(*) FROM events WHERE type LIKE 'orders:%'`)
	_, err := f.db.Pool.Exec(ctx, `UPDATE order_totals SET amount_cents = 0`) // a bug's damage
	require.NoError(t, err)

	out, code := f.run(t, "projection", "rebuild", "orders:order-totals", "--batch-size", "50")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "rebuilding orders:order-totals from the start of the log")
	require.Contains(t, out, "events applied")
	require.Contains(t, out, fmt.Sprintf("rebuilt orders:order-totals: %d events applied", events))
	require.Contains(t, out, `"public"."order_totals" swapped in`)
	f.totalsMatchRecount(t)
	require.Zero(t, f.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))

	// The live consumer carries on after the rebuilt cursor.
	f.place(t, "acme", 10, 10, 2)
	f.drain(t, d, "orders:order-totals")
	f.totalsMatchRecount(t)

	for name, want := range map[string]string{
		"users:send-welcome-email": "side-effect-only",
		"orders:nope":              "unknown projection",
	} {
		out, code := f.run(t, "projection", "rebuild", name)
		require.Equal(t, 1, code, out)
		require.Contains(t, out, want)
	}
	out, code = f.run(t, "projection", "rebuild")
	require.Equal(t, 1, code, out)
	// A batch size no pass can hold is a one-line refusal, not a panic.
	out, code = f.run(t, "projection", "rebuild", "orders:order-totals", "--batch-size", "4611686018427387904")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "kumiko: --batch-size 4611686018427387904 is not between 1 and 10000")
	require.NotContains(t, out, "panic")
	require.Zero(t, f.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
}

// startKilled starts a slow rebuild and SIGKILLs it once it has applied
// its first events.
func (f *logFixture) startKilled(t *testing.T) {
	t.Helper()
	cmd := exec.Command(f.bin, "projection", "rebuild", "orders:order-totals", "--batch-size", "5")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+f.db.URL)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(30 * time.Second)
	for applied := false; !applied; {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the rebuild ended before it was killed")
			applied = strings.Contains(l, "events applied")
		case <-timeout:
			_ = cmd.Process.Kill()
			t.Fatal("no progress from the rebuild")
		}
	}
	require.NoError(t, cmd.Process.Kill()) // SIGKILL
	go func() {
		// Drain the pipe until the process is gone.
		for range lines {
		}
	}()
	_ = cmd.Wait()
	// Its server backend ends (releasing the rebuild lock) once it notices
	// the client is gone: a moment later, not when the process is reaped.
	require.Eventually(t, func() bool {
		return f.int(t, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 0
	}, 10*time.Second, 10*time.Millisecond, "the killed rebuild's backend still holds its lock")
	require.Equal(t, int64(1), f.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`), "the killed rebuild leaves its shadow schema")
	require.Equal(t, int64(1), f.int(t, `SELECT count(*) FROM event_consumers WHERE name = 'orders:order-totals#rebuild'`))
}

func testProjectionRebuildKilled(t *testing.T, bin string) {
	f := newLogFixture(t, bin)
	f.place(t, "acme", 3000, 100, 10)
	f.db.WaitVisible(t)
	events := f.int(t, `SELECT count(*) FROM events WHERE type LIKE 'orders:%'`)
	_, err := f.db.Pool.Exec(context.Background(), `UPDATE events SET created_at = now() - interval '40 days'`)
	require.NoError(t, err)

	f.startKilled(t)
	// The leftover consumer row pins retention like any consumer.
	out, code := f.run(t, "events", "prune", "--older-than-days", "30", "--types", "orders:event:placed")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "orders:order-totals#rebuild")
	// --abandon removes the leftover.
	out, code = f.run(t, "projection", "rebuild", "orders:order-totals", "--abandon")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "removed the leftover")
	require.Zero(t, f.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, f.int(t, `SELECT count(*) FROM event_consumers`))

	// The leftover of a projection this build no longer declares: --abandon
	// removes it all the same (it would pin retention forever), a rebuild
	// of that name is refused.
	_, err = f.db.Pool.Exec(context.Background(), `CREATE SCHEMA `+pgx.Identifier{rebuild.ShadowSchema("orders:old-totals")}.Sanitize()+`;
		INSERT INTO event_consumers (name, instance_id) VALUES ('orders:old-totals#rebuild', '__shared__')`)
	require.NoError(t, err)
	out, code = f.run(t, "projection", "rebuild", "orders:old-totals")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, `unknown projection "orders:old-totals"`)
	out, code = f.run(t, "projection", "rebuild", "orders:old-totals", "--abandon")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "removed the leftover of an interrupted rebuild of orders:old-totals")
	require.Zero(t, f.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, f.int(t, `SELECT count(*) FROM event_consumers`))

	// Killed again; the next rebuild removes the leftover and starts over.
	f.startKilled(t)
	out, code = f.run(t, "projection", "rebuild", "orders:order-totals")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "removed the leftover of an earlier, interrupted rebuild")
	require.Contains(t, out, fmt.Sprintf("rebuilt orders:order-totals: %d events applied", events))
	f.totalsMatchRecount(t)
	require.Zero(t, f.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Equal(t, []string{"orders:order-totals"}, f.strings(t, `SELECT name FROM event_consumers`))
	require.Equal(t, events, f.int(t, `SELECT events_processed FROM event_consumers WHERE name = 'orders:order-totals'`))
}

// testPruneHandled: `kumiko jobs prune-handled` deletes the HandledOnce
// claims older than the cutoff (nothing else does) and keeps the others.
func testPruneHandled(t *testing.T, bin string) {
	f := newLogFixture(t, bin)
	_, err := f.db.Pool.Exec(context.Background(), `INSERT INTO handled (tenant_id, key, handled_at) VALUES
  ('acme', 'old', now() - interval '100 days'), ('globex', 'old', now() - interval '91 days'), ('acme', 'new', now())`)
	require.NoError(t, err)
	out, code := f.run(t, "jobs", "prune-handled")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "--older-than-days is required")
	out, code = f.run(t, "jobs", "prune-handled", "--older-than-days", "0")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "must be between 1 and 1000000")
	out, code = f.run(t, "jobs", "prune-handled", "--older-than-days", "90")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "deleted 2 HandledOnce claim(s) older than 90 days")
	require.Equal(t, []string{"acme/new"}, f.strings(t, `SELECT tenant_id || '/' || key FROM handled ORDER BY 1`))
}

// testPruneDeadLetters: `kumiko consumer prune-dead-letters` deletes the
// dead letters older than the cutoff (nothing else does) and keeps the
// others.
func testPruneDeadLetters(t *testing.T, bin string) {
	f := newLogFixture(t, bin)
	_, err := f.db.Pool.Exec(context.Background(), `INSERT INTO event_dead_letters (consumer, instance_id, position, event_type, tenant_id, error, created_at) VALUES
  ('gone:projection', '__shared__', 1, 'x:event:y', 'acme', 'boom', now() - interval '40 days'),
  ('live:projection', '__shared__', 2, 'x:event:y', 'acme', 'boom', now())`)
	require.NoError(t, err)
	out, code := f.run(t, "consumer", "prune-dead-letters")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "--older-than-days is required")
	out, code = f.run(t, "consumer", "prune-dead-letters", "--older-than-days", "0")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "must be between 1 and 1000000")
	out, code = f.run(t, "consumer", "prune-dead-letters", "--older-than-days", "30")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "deleted 1 dead letter(s) older than 30 days")
	require.Equal(t, []string{"live:projection"}, f.strings(t, `SELECT consumer FROM event_dead_letters`))
}
