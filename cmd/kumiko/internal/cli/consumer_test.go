package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestConsumerCommands runs `kumiko consumer ...` as a real binary (built
// once) against fresh databases whose consumer state was produced by real
// dispatcher passes.
func TestConsumerCommands(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kumiko")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kumiko-go/kumiko/cmd/kumiko").CombinedOutput()
	require.NoError(t, err, string(out))
	for name, test := range map[string]func(*testing.T, string){
		"list":            testConsumerList,
		"status":          testConsumerStatus,
		"restart":         testConsumerRestart,
		"skip":            testConsumerSkip,
		"disable-enable":  testConsumerDisableEnable,
		"sse-broadcast":   testConsumerSSEBroadcast,
		"rewind":          testConsumerRewind,
		"remove-instance": testConsumerRemoveInstance,
		"configuration":   testConsumerConfiguration,
		"unmigrated":      testConsumerUnmigrated,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, bin)
		})
	}
}

type opsNoted struct {
	N int `json:"n"`
}

// opsFixture is a database whose consumer ops:broken is dead (its handler
// always fails), ops:healthy has delivered all 3 events and ops:local is a
// per-instance consumer of pod-1 that has delivered nothing.
type opsFixture struct {
	bin string
	db  *kumikotest.DB
	d   *dispatcher.Dispatcher
}

func newOpsFixture(t *testing.T, bin string) *opsFixture {
	t.Helper()
	f := &opsFixture{bin: bin, db: kumikotest.NewDB(t)}
	reg := framework.NewRegistry()
	ft := reg.Feature("ops")
	ev := framework.DefineEvent[opsNoted](ft, "noted", nil)
	noop := func(context.Context, *framework.Tx, framework.Event[opsNoted]) error { return nil }
	framework.On(framework.MultiStreamProjection(ft, "healthy", nil), ev, noop)
	framework.On(framework.MultiStreamProjection(ft, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance}), ev, noop)
	framework.On(framework.MultiStreamProjection(ft, "broken", &framework.ProjectionOptions{MaxAttempts: 1}), ev,
		func(context.Context, *framework.Tx, framework.Event[opsNoted]) error {
			return errors.New("broken handler")
		})
	rt, err := framework.NewRuntime(reg, f.db.Pool, nil)
	require.NoError(t, err)
	f.d, err = dispatcher.New(f.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "pod-1"})
	require.NoError(t, err)
	require.NoError(t, f.d.Register(context.Background()))
	for i := range 3 {
		_, err := rt.InTx(context.Background(), "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: "1"}, framework.AnyVersion, ev.With(opsNoted{N: i}))
		})
		require.NoError(t, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		broken := f.status(t, "ops:broken", "")
		healthy := f.status(t, "ops:healthy", "")
		if broken.Status == dispatcher.StateDead && healthy.Lag == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "fixture state not reached")
		for _, name := range []string{"ops:broken", "ops:healthy"} {
			_, err := f.d.RunOnce(context.Background(), name)
			require.NoError(t, err)
		}
		time.Sleep(3 * time.Millisecond)
	}
	return f
}

func (f *opsFixture) status(t *testing.T, name, instance string) dispatcher.ConsumerStatus {
	t.Helper()
	st, err := dispatcher.Status(context.Background(), f.db.Pool, name, instance)
	require.NoError(t, err)
	return st
}

// run runs the binary with DATABASE_URL set and returns stdout, stderr and
// the exit code.
func (f *opsFixture) run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runKumiko(t, f.bin, []string{"DATABASE_URL=" + f.db.URL}, args...)
}

func runKumiko(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	t.Logf("$ kumiko %s\n%s%s", strings.Join(args, " "), out.String(), errOut.String())
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return out.String(), errOut.String(), exit.ExitCode()
	}
	require.NoError(t, err)
	return out.String(), errOut.String(), 0
}

// requireRefused asserts exit code 1 with the message on stderr only.
func requireRefused(t *testing.T, stdout, stderr string, code int, msg string) {
	t.Helper()
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Equal(t, "kumiko: "+msg+"\n", stderr)
}

func testConsumerList(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	out, errOut, code := f.run(t, "consumer", "list")
	require.Zero(t, code, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, []string{"NAME", "INSTANCE", "STATUS", "LAG", "CURSOR", "ATTEMPTS", "PROCESSED", "HEARTBEAT", "LAST", "ERROR"}, strings.Fields(lines[0]))
	broken := strings.Fields(lines[1])
	require.Equal(t, []string{"ops:broken", "__shared__", "dead", "3", "0-0", "1", "0"}, broken[:7])
	require.Contains(t, lines[1], "broken handler")
	healthy := f.status(t, "ops:healthy", "")
	require.Equal(t, []string{"ops:healthy", "__shared__", "idle", "0", healthy.Cursor.String(), "0", "3"}, strings.Fields(lines[2])[:7])
	require.Equal(t, []string{"ops:local", "pod-1", "idle", "3"}, strings.Fields(lines[3])[:4])

	out, errOut, code = f.run(t, "consumer", "list", "--json")
	require.Zero(t, code, errOut)
	var rows []struct {
		Name, InstanceID, Status, Cursor string
		Lag                              int64
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 3)
	require.Equal(t, "dead", rows[0].Status)
	require.Equal(t, healthy.Cursor.String(), rows[1].Cursor)
	require.Equal(t, "pod-1", rows[2].InstanceID)
	require.EqualValues(t, 3, rows[2].Lag)
}

func testConsumerStatus(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	out, errOut, code := f.run(t, "consumer", "status", "ops:broken")
	require.Zero(t, code, errOut)
	st := f.status(t, "ops:broken", "")
	require.Regexp(t, `(?m)^status:\s+dead since \d{4}-`, out)
	require.Regexp(t, fmt.Sprintf(`(?m)^failed position:\s+%d$`, *st.FailedPosition), out)
	require.Regexp(t, `(?m)^last error:\s+.*broken handler`, out)
	require.Regexp(t, `(?m)^lag:\s+3$`, out)
	require.Contains(t, out, "dead letters: none")

	out, errOut, code = f.run(t, "consumer", "status", "ops:local", "--instance", "pod-1", "--json")
	require.Zero(t, code, errOut)
	var js struct {
		Name, InstanceID, Status string
		Lag                      int64
	}
	require.NoError(t, json.Unmarshal([]byte(out), &js))
	require.Equal(t, "pod-1", js.InstanceID)
	require.Equal(t, "idle", js.Status)

	out, errOut, code = f.run(t, "consumer", "status", "ops:nope")
	requireRefused(t, out, errOut, code, "consumer ops:nope not found")
	out, errOut, code = f.run(t, "consumer", "status", "ops:local") // no shared row
	requireRefused(t, out, errOut, code, "consumer ops:local has no shared row: it is per-instance, name one of its instances: pod-1")
}

func testConsumerRestart(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	before := f.status(t, "ops:broken", "")
	out, errOut, code := f.run(t, "consumer", "restart", "ops:broken")
	require.Zero(t, code, errOut)
	require.Equal(t, "restarted consumer ops:broken: the next pass retries its failing event\n", out)
	after := f.status(t, "ops:broken", "")
	require.Equal(t, dispatcher.StateIdle, after.Status)
	require.Equal(t, before.Cursor, after.Cursor)
	require.Zero(t, after.Attempts)

	out, errOut, code = f.run(t, "consumer", "restart", "ops:broken")
	requireRefused(t, out, errOut, code, "consumer ops:broken is idle; restart needs dead")
	out, errOut, code = f.run(t, "consumer", "restart", "ops:nope")
	requireRefused(t, out, errOut, code, "consumer ops:nope not found")
}

func testConsumerSkip(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	failed := *f.status(t, "ops:broken", "").FailedPosition
	out, errOut, code := f.run(t, "consumer", "skip", "ops:broken")
	require.Zero(t, code, errOut)
	require.Regexp(t, fmt.Sprintf(`^skipped event %d \(ops:event:noted, tenant acme\) of consumer ops:broken; dead letter \d+\n$`, failed), out)
	st := f.status(t, "ops:broken", "")
	require.Equal(t, dispatcher.StateIdle, st.Status)
	require.EqualValues(t, 2, st.Lag)
	require.Len(t, st.DeadLetters, 1)

	out, errOut, code = f.run(t, "consumer", "status", "ops:broken")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "dead letters (newest first):")
	require.Contains(t, out, "skipped by operator")

	out, errOut, code = f.run(t, "consumer", "skip", "ops:healthy")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "kumiko: consumer ops:healthy has no failing event and no event after its cursor")
}

// testConsumerSSEBroadcast: skip (while it is not failing) and disable of
// the SSE consumer are refused, saying why and what to do instead.
func testConsumerSSEBroadcast(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	_, err := f.db.Pool.Exec(context.Background(),
		`INSERT INTO event_consumers (name, instance_id) VALUES ($1, 'api-1')`, dispatcher.SSEConsumerName)
	require.NoError(t, err)
	out, errOut, code := f.run(t, "consumer", "skip", dispatcher.SSEConsumerName, "--instance", "api-1")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "kumiko: consumer system:consumer:sse-broadcast (instance api-1) feeds the live SSE streams of its process and is not failing at an event")
	out, errOut, code = f.run(t, "consumer", "disable", dispatcher.SSEConsumerName, "--instance", "api-1")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "drain or stop that process")
	require.Equal(t, dispatcher.StateIdle, f.status(t, dispatcher.SSEConsumerName, "api-1").Status)
}

func testConsumerDisableEnable(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	out, errOut, code := f.run(t, "consumer", "disable", "ops:local", "--instance", "pod-1")
	require.Zero(t, code, errOut)
	require.Equal(t, "disabled consumer ops:local (instance pod-1)\n", out)
	n, err := f.d.RunOnce(context.Background(), "ops:local")
	require.NoError(t, err)
	require.Zero(t, n, "a disabled consumer gets nothing")

	out, errOut, code = f.run(t, "consumer", "disable", "ops:local", "--instance", "pod-1")
	requireRefused(t, out, errOut, code, "consumer ops:local (instance pod-1) is disabled; disable needs idle or dead")

	out, errOut, code = f.run(t, "consumer", "enable", "ops:local", "--instance", "pod-1")
	require.Zero(t, code, errOut)
	require.Equal(t, "enabled consumer ops:local (instance pod-1)\n", out)
	require.Equal(t, dispatcher.StateIdle, f.status(t, "ops:local", "pod-1").Status)
	deadline := time.Now().Add(20 * time.Second)
	for f.status(t, "ops:local", "pod-1").Lag > 0 {
		require.True(t, time.Now().Before(deadline))
		_, err := f.d.RunOnce(context.Background(), "ops:local")
		require.NoError(t, err)
	}

	out, errOut, code = f.run(t, "consumer", "enable", "ops:local", "--instance", "pod-1")
	requireRefused(t, out, errOut, code, "consumer ops:local (instance pod-1) is idle; enable needs disabled")
	out, errOut, code = f.run(t, "consumer", "enable", "ops:broken")
	requireRefused(t, out, errOut, code, "consumer ops:broken is dead; enable needs disabled")

	// Disabled while dead: disabled, not "disabled since" its death, and
	// no next attempt; the failure stays on record.
	out, errOut, code = f.run(t, "consumer", "status", "ops:broken")
	require.Zero(t, code, errOut)
	require.Regexp(t, `(?m)^status:\s+dead since \d{4}-`, out)
	require.NotContains(t, out, "next attempt")
	out, errOut, code = f.run(t, "consumer", "disable", "ops:broken")
	require.Zero(t, code, errOut)
	require.Equal(t, "disabled consumer ops:broken\n", out)
	out, errOut, code = f.run(t, "consumer", "status", "ops:broken")
	require.Zero(t, code, errOut)
	require.Regexp(t, `(?m)^status:\s+disabled$`, out)
	require.NotContains(t, out, "next attempt")
	require.Regexp(t, `(?m)^last error:\s+.*broken handler`, out)
}

func testConsumerRewind(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	head := f.status(t, "ops:healthy", "").Cursor
	var second int64
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT position FROM events ORDER BY commit_key, position OFFSET 1 LIMIT 1`).Scan(&second))

	out, errOut, code := f.run(t, "consumer", "rewind", "ops:healthy", "--to-position", fmt.Sprint(second))
	require.Zero(t, code, errOut)
	st := f.status(t, "ops:healthy", "")
	require.Equal(t, fmt.Sprintf("rewound consumer ops:healthy from cursor %s to %s\n", head, st.Cursor), out)
	require.EqualValues(t, 2, st.Lag)
	require.Equal(t, second-1, st.Cursor.Position)

	out, errOut, code = f.run(t, "consumer", "rewind", "ops:healthy", "--to-time", "2000-01-01T00:00:00Z")
	require.Zero(t, code, errOut)
	before := st.Cursor
	st = f.status(t, "ops:healthy", "")
	require.Equal(t, fmt.Sprintf("rewound consumer ops:healthy from cursor %s to %s\n", before, st.Cursor), out)
	require.EqualValues(t, 3, st.Lag)

	// A dead consumer rewound to the start turns idle.
	out, errOut, code = f.run(t, "consumer", "rewind", "ops:broken", "--to-position", "0")
	require.Zero(t, code, errOut)
	require.Equal(t, "rewound consumer ops:broken from cursor 0-0 to 0-0\n", out)
	require.Equal(t, dispatcher.StateIdle, f.status(t, "ops:broken", "").Status)

	out, errOut, code = f.run(t, "consumer", "rewind", "ops:healthy", "--to-position", "987654")
	requireRefused(t, out, errOut, code, "no event has position 987654")
	out, errOut, code = f.run(t, "consumer", "rewind", "ops:healthy", "--to-position", fmt.Sprint(second))
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "rewind only moves back")
	for _, args := range [][]string{
		{"--to-time", "yesterday"},
		{"--to-position", "1", "--to-time", "2000-01-01T00:00:00Z"},
		{},
		{"--to-position", "-3"},
	} {
		out, errOut, code = f.run(t, append([]string{"consumer", "rewind", "ops:healthy"}, args...)...)
		require.Equal(t, 1, code, args)
		require.Empty(t, out)
		require.True(t, strings.HasPrefix(errOut, "kumiko: "), errOut)
	}
	require.EqualValues(t, 3, f.status(t, "ops:healthy", "").Lag, "refusals change nothing")
}

func testConsumerRemoveInstance(t *testing.T, bin string) {
	f := newOpsFixture(t, bin)
	out, errOut, code := f.run(t, "consumer", "remove-instance", "pod-1")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "kumiko: instance pod-1 had a heartbeat")
	// The same refusal as the admin API's (README: same rules and messages).
	out, errOut, code = f.run(t, "consumer", "remove-instance", "__shared__")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Equal(t, "kumiko: the shared instance __shared__ cannot be removed\n", errOut)
	_, err := f.db.Pool.Exec(context.Background(), `UPDATE event_consumers SET heartbeat_at = now() - interval '1 hour' WHERE instance_id = 'pod-1'`)
	require.NoError(t, err)
	out, errOut, code = f.run(t, "consumer", "remove-instance", "pod-1")
	require.Zero(t, code, errOut)
	require.Equal(t, "removed 1 consumer row(s) of instance pod-1\n", out)
	_, err = dispatcher.Status(context.Background(), f.db.Pool, "ops:local", "pod-1")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
}

func testConsumerConfiguration(t *testing.T, bin string) {
	out, errOut, code := runKumiko(t, bin, []string{"DATABASE_URL="}, "consumer", "list")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "DATABASE_URL")
}

// testConsumerUnmigrated: against a database that was never migrated, an
// ops verb says so and names the command that fixes it, instead of a bare
// 'relation "event_consumers" does not exist'.
func testConsumerUnmigrated(t *testing.T, bin string) {
	name, admin := unusedDatabase(t, "kumiko_cli_unmigrated_")
	_, err := admin.Exec(context.Background(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	out, errOut, code := runKumiko(t, bin, []string{"DATABASE_URL=postgres://postgres@127.0.0.1:5432/" + name + "?sslmode=disable"}, "consumer", "list")
	require.Equal(t, 1, code)
	require.Empty(t, out)
	require.Contains(t, errOut, "event_consumers")
	require.Contains(t, errOut, "run kumiko migrate")
}
