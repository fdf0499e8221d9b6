package cli_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/cmd/kumiko/internal/cli"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// TestUnknownVerbFails: a mistyped verb of a command group (`kumiko jobs
// retyr ID`) is an error with exit code 1, like an unknown top-level
// command, not the group's help with exit code 0; the group alone, or
// followed by help, still shows its help.
func TestUnknownVerbFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus" for "kumiko"`},
		{[]string{"jobs", "retyr", "some-id"}, `unknown command "retyr" for "kumiko jobs" (did you mean retry?)`},
		{[]string{"jobs", "lsit"}, `unknown command "lsit" for "kumiko jobs"`},
		{[]string{"consumer", "restrat", "orders:order-totals"}, `unknown command "restrat" for "kumiko consumer"`},
		{[]string{"events", "purne"}, `unknown command "purne" for "kumiko events"`},
		{[]string{"projection", "rebiuld", "orders:order-totals"}, `unknown command "rebiuld" for "kumiko projection"`},
		// cobra's own group: `kumiko completion bassh > /etc/bash_completion.d/kumiko`
		// wrote the group's help into the file and succeeded.
		{[]string{"completion", "bassh"}, `unknown command "bassh" for "kumiko completion" (did you mean bash?)`},
		// `kumiko help` on a topic it does not have said so and exited 0.
		{[]string{"help", "consumr"}, `unknown help topic "consumr" (did you mean consumer?)`},
		{[]string{"help", "jobs", "lsit"}, `unknown help topic "jobs lsit"`},
	} {
		name := "kumiko " + strings.Join(tc.args, " ")
		root := cli.Root(nil, nil)
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(tc.args)
		err := root.ExecuteContext(context.Background())
		require.Error(t, err, name)
		require.Contains(t, err.Error(), tc.want, name)
		require.Empty(t, out.String(), name)
		require.Equal(t, 1, cli.Main(context.Background(), tc.args, nil, nil), name)
	}

	for _, group := range []string{"jobs", "consumer", "events", "projection", "completion"} {
		for _, args := range [][]string{{group}, {group, "help"}} {
			root := cli.Root(nil, nil)
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetArgs(args)
			require.NoError(t, root.ExecuteContext(context.Background()), args)
			require.Contains(t, out.String(), "Available Commands:", args)
		}
	}
	for _, args := range [][]string{{"help"}, {"help", "jobs"}, {"help", "jobs", "list"}} {
		root := cli.Root(nil, nil)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(args)
		require.NoError(t, root.ExecuteContext(context.Background()), args)
		require.Contains(t, out.String(), "Usage:", args)
	}
}

// TestJobsListRefusesALimitOutOfRange: `kumiko jobs list --limit` takes
// 1 to 1000 as its help says; 0 is refused like 1001, not read as the
// default.
func TestJobsListRefusesALimitOutOfRange(t *testing.T) {
	srv := redistest.Start(t)
	t.Setenv("REDIS_URL", "redis://"+srv.Addr()+"/0")
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
	run := execute
	out, err := run("jobs", "list", "--limit", "1")
	require.NoError(t, err)
	require.Equal(t, "no archived job runs\n", out)
	for _, limit := range []string{"0", "-1", "1001"} {
		_, err := run("jobs", "list", "--limit", limit)
		require.Error(t, err, limit)
		require.Contains(t, err.Error(), "--limit "+limit+" is not between 1 and 1000")
	}
}

// TestTokenRefusesANonPositiveTTL: `kumiko token --ttl` must be positive;
// 0 or a negative lifetime (asking for an expired token, say) is refused
// instead of minting a token valid for an hour.
func TestTokenRefusesANonPositiveTTL(t *testing.T) {
	t.Setenv("JWT_SECRET", strings.Repeat("s", 40))
	run := func(args ...string) (string, error) {
		return execute(append([]string{"token", "--tenant", "acme", "--user", "alice"}, args...)...)
	}
	out, err := run("--ttl", "5m")
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(out, "."), "a JWT: %q", out)
	for _, ttl := range []string{"0s", "-1h"} {
		out, err := run("--ttl", ttl)
		require.Error(t, err, ttl)
		require.Contains(t, err.Error(), "--ttl must be positive")
		require.Empty(t, out, ttl)
	}
}

// TestTokenCarriesTenantUserAndRoles: `kumiko token --tenant T --user U
// --roles r1,r2` prints one line, a token that the keyring of JWT_SECRET
// (here the rotation form, whose first key signs under its kid) verifies as
// that tenant, user and roles, expiring after --ttl; a missing --tenant or
// --user, or a missing JWT_SECRET, prints nothing and fails.
func TestTokenCarriesTenantUserAndRoles(t *testing.T) {
	s1, s2 := strings.Repeat("a", 32), strings.Repeat("b", 32)
	t.Setenv("JWT_SECRET", "new:"+s1+",old:"+s2)
	run := func(args ...string) (string, error) { return execute(append([]string{"token"}, args...)...) }
	out, err := run("--tenant", "acme", "--user", "alice", "--roles", "admin, ops", "--ttl", "10m")
	require.NoError(t, err)
	require.True(t, strings.HasSuffix(out, "\n") && strings.Count(out, "\n") == 1, "one line: %q", out)
	tok := strings.TrimSpace(out)
	ring, err := auth.NewKeyring([]auth.Key{{ID: "new", Secret: []byte(s1)}, {ID: "old", Secret: []byte(s2)}})
	require.NoError(t, err)
	p, exp, err := ring.VerifyUntil(tok)
	require.NoError(t, err)
	require.Equal(t, auth.Principal{UserID: "alice", TenantID: "acme", Roles: []string{"admin", "ops"}}, p)
	require.WithinDuration(t, time.Now().Add(10*time.Minute), exp, time.Minute)
	// Signed by the first key: the old key alone does not verify it.
	old, err := auth.NewKeyring([]auth.Key{{ID: "old", Secret: []byte(s2)}})
	require.NoError(t, err)
	_, err = old.Verify(tok)
	require.Error(t, err)

	for _, args := range [][]string{{"--user", "alice"}, {"--tenant", "acme"}} {
		out, err := run(args...)
		require.ErrorContains(t, err, "--tenant and --user are required", args)
		require.Empty(t, out, args)
	}
	t.Setenv("JWT_SECRET", "")
	out, err = run("--tenant", "acme", "--user", "alice")
	require.ErrorContains(t, err, "JWT_SECRET")
	require.Empty(t, out)
	require.Equal(t, 1, cli.Main(context.Background(), []string{"token", "--tenant", "acme", "--user", "alice"}, nil, nil))
}

// TestPruneRefusesAnEmptyTypes: `kumiko events prune --types ""` (an unset
// variable in a script) is refused before anything is deleted, instead of
// falling back to the default of every pub/sub type.
func TestPruneRefusesAnEmptyTypes(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none") // never reached
	for _, types := range []string{"", " , "} {
		root := cli.Root(nil, nil)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs([]string{"events", "prune", "--older-than-days", "30", "--types", types})
		err := root.ExecuteContext(context.Background())
		require.Error(t, err, types)
		require.Contains(t, err.Error(), "--types names no event type", types)
	}
}

// TestProjectionRebuildRefusesABatchSizeOutOfRange: `kumiko projection
// rebuild --batch-size` takes 1 to 10,000 as the README says, and the
// admin API refuses 0 and a batch size with abandon: the CLI refuses them
// too, before it connects, instead of reading 0 as the default and
// silently ignoring --batch-size next to --abandon.
func TestProjectionRebuildRefusesABatchSizeOutOfRange(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none") // never reached
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch-size", "0"}, "--batch-size 0 is not between 1 and 10000"},
		{[]string{"--batch-size", "-1"}, "--batch-size -1 is not between 1 and 10000"},
		{[]string{"--batch-size", "10001"}, "--batch-size 10001 is not between 1 and 10000"},
		{[]string{"--batch-size", "5", "--abandon"}, "[abandon batch-size] were all set"},
	} {
		root := cli.Root(nil, nil)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(io.Discard)
		root.SetArgs(append([]string{"projection", "rebuild", "orders:order-totals"}, tc.args...))
		err := root.ExecuteContext(context.Background())
		require.Error(t, err, tc.args)
		require.Contains(t, err.Error(), tc.want, tc.args)
		require.Empty(t, out.String(), tc.args)
	}
}

// TestBlankNamesAreRefused: a blank NAME or ID (an unset variable in a
// script) and a --tenant or --user padded with white space are refused
// before anything connects, instead of looking up "" or minting a token
// for another tenant than the one meant.
func TestBlankNamesAreRefused(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none") // never reached
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0")                   // never reached
	t.Setenv("JWT_SECRET", strings.Repeat("s", 40))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"consumer", "status", ""}, "NAME must not be empty"},
		{[]string{"consumer", "restart", " "}, "NAME must not be empty"},
		{[]string{"consumer", "skip", ""}, "NAME must not be empty"},
		{[]string{"consumer", "rewind", "", "--to-position", "0"}, "NAME must not be empty"},
		{[]string{"consumer", "remove-instance", ""}, "ID must not be empty"},
		{[]string{"projection", "rebuild", ""}, "NAME must not be empty"},
		{[]string{"jobs", "retry", ""}, "ID must not be empty"},
		{[]string{"token", "--tenant", " ", "--user", "alice"}, `--tenant " " is blank or starts or ends with white space`},
		{[]string{"token", "--tenant", "acme ", "--user", "alice"}, `--tenant "acme "`},
		{[]string{"token", "--tenant", "acme", "--user", "\talice"}, `--user "\talice"`},
	} {
		root := cli.Root(nil, nil)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(io.Discard)
		root.SetArgs(tc.args)
		err := root.ExecuteContext(context.Background())
		require.ErrorContains(t, err, tc.want, tc.args)
		require.Empty(t, out.String(), tc.args)
	}
}

// TestNumericFlagsAreDecimal: the numeric flags are read in base 10, as
// their help and the README write them. pflag's own integer flags take Go's
// base prefixes, so `--older-than-days 030` (a zero-padded number from a
// script) pruned what was older than 24 days, `--older-than-days 08` failed
// and `--to-position 0x10` rewound to position 16.
func TestNumericFlagsAreDecimal(t *testing.T) {
	db := kumikotest.NewDB(t)
	t.Setenv("DATABASE_URL", db.URL)
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0") // never reached
	run := execute
	out, err := run("consumer", "prune-dead-letters", "--older-than-days", "030")
	require.NoError(t, err)
	require.Equal(t, "deleted 0 dead letter(s) older than 30 days\n", out)
	out, err = run("jobs", "prune-handled", "--older-than-days", "090")
	require.NoError(t, err)
	require.Equal(t, "deleted 0 HandledOnce claim(s) older than 90 days\n", out)
	out, err = run("consumer", "prune-dead-letters", "--older-than-days", "1")
	require.NoError(t, err)
	require.Equal(t, "deleted 0 dead letter(s) older than 1 day\n", out)

	for _, tc := range []struct {
		args []string
		want string
	}{
		// In range only when read as octal (513, 4097): refused as the
		// decimal numbers they are.
		{[]string{"jobs", "list", "--limit", "01001"}, "--limit 1001 is not between 1 and 1000"},
		{[]string{"projection", "rebuild", "orders:order-totals", "--batch-size", "010001"}, "--batch-size 10001 is not between 1 and 10000"},
		{[]string{"consumer", "rewind", "orders:order-totals", "--to-position", "0x10"}, `invalid argument "0x10" for "--to-position" flag`},
		{[]string{"events", "prune", "--older-than-days", "0x1e"}, `invalid argument "0x1e" for "--older-than-days" flag`},
		{[]string{"consumer", "prune-dead-letters", "--older-than-days", "0b11"}, `invalid argument "0b11" for "--older-than-days" flag`},
		{[]string{"jobs", "prune-handled", "--older-than-days", "0o36"}, `invalid argument "0o36" for "--older-than-days" flag`},
		{[]string{"jobs", "prune-handled", "--older-than-days", "3_0"}, `invalid argument "3_0" for "--older-than-days" flag`},
	} {
		out, err := run(tc.args...)
		require.ErrorContains(t, err, tc.want, tc.args)
		require.Empty(t, out, tc.args)
	}
}

// TestGroupSummariesListEveryVerb: a command group whose one-line summary
// in `kumiko --help` lists its verbs in parentheses lists all of them
// (`consumer` left out remove-instance), and `kumiko token`'s usage line
// shows the lifetime it defaults to.
func TestGroupSummariesListEveryVerb(t *testing.T) {
	t.Parallel()
	root := cli.Root(nil, nil)
	listed := 0
	for _, group := range root.Commands() {
		open := strings.LastIndex(group.Short, "(")
		if !group.HasSubCommands() || open < 0 || !strings.HasSuffix(group.Short, ")") {
			continue
		}
		listed++
		var verbs []string
		for _, c := range group.Commands() {
			if c.IsAvailableCommand() {
				verbs = append(verbs, c.Name())
			}
		}
		got := strings.Split(strings.TrimSuffix(group.Short[open+1:], ")"), ", ")
		require.ElementsMatch(t, verbs, got, group.Name())
	}
	require.GreaterOrEqual(t, listed, 3, "consumer, events and projection list their verbs")

	token, _, err := root.Find([]string{"token"})
	require.NoError(t, err)
	_, shown, ok := strings.Cut(token.Use, "[--ttl ")
	require.True(t, ok, token.Use)
	shown, _, _ = strings.Cut(shown, "]")
	d, err := time.ParseDuration(shown)
	require.NoError(t, err)
	require.Equal(t, token.Flag("ttl").DefValue, d.String(), token.Use)
}

// TestInterruptedCommandSaysSo: a command that a signal stopped (ctx ended)
// says that it was interrupted, after its error (a bare "context
// canceled" otherwise); one that failed on its own does not.
func TestInterruptedCommandSaysSo(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
	stderrOf := func(ctx context.Context) (int, string) {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		old := os.Stderr
		os.Stderr = w
		code := cli.Main(ctx, []string{"consumer", "list"}, nil, nil)
		os.Stderr = old
		require.NoError(t, w.Close())
		out, err := io.ReadAll(r)
		require.NoError(t, err)
		return code, string(out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	code, out := stderrOf(ctx)
	require.Equal(t, 1, code)
	require.Contains(t, out, "kumiko: interrupted")
	code, out = stderrOf(context.Background())
	require.Equal(t, 1, code)
	require.NotContains(t, out, "interrupted", out)
}

// execute runs the kumiko command tree with args and returns what it wrote
// to stdout and its error (stderr is discarded).
func execute(args ...string) (string, error) {
	root := cli.Root(nil, nil)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// TestBlankSelectorFlagsAreRefused: a selector flag given explicitly but
// blank (an unset variable in a script: `--instance "$POD"`) is refused
// before anything runs, instead of falling back to its default, which
// would act on the shared row, or list every state, lane or tenant.
func TestBlankSelectorFlagsAreRefused(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none") // never reached
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0")                   // never reached
	t.Setenv("JWT_SECRET", strings.Repeat("s", 40))
	for _, args := range [][]string{
		{"consumer", "disable", "orders:order-totals", "--instance", ""},
		{"consumer", "status", "orders:order-totals", "--instance", " "},
		{"jobs", "list", "--state", ""},
		{"jobs", "list", "--lane", ""},
		{"jobs", "list", "--tenant", ""},
		{"jobs", "retry", "some-id", "--lane", ""},
	} {
		out, err := execute(args...)
		require.Error(t, err, args)
		require.Contains(t, err.Error(), "is empty; leave it out", args)
		require.Empty(t, out, args)
	}
}

// TestOutputWriteFailureFails: a command whose output cannot be written
// (stdout on a full disk, `kumiko token > token.txt`) fails with exit code
// 1 and says so on stderr, instead of exiting 0 with the output lost.
func TestOutputWriteFailureFails(t *testing.T) {
	t.Setenv("JWT_SECRET", strings.Repeat("s", 40))
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	require.NoError(t, err)
	defer full.Close()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = full, w
	code := cli.Main(context.Background(), []string{"token", "--tenant", "acme", "--user", "alice"}, nil, nil)
	os.Stdout, os.Stderr = oldOut, oldErr
	require.NoError(t, w.Close())
	stderr, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, 1, code)
	require.Contains(t, string(stderr), "kumiko: write output: ")
	require.Contains(t, string(stderr), "no space left on device")
}

// TestTokenReportsJWTSecretAsConfiguration: `kumiko token` reports a bad
// JWT_SECRET as the other commands report their configuration: under
// "configuration:", one line per problem, each naming the variable.
func TestTokenReportsJWTSecretAsConfiguration(t *testing.T) {
	t.Setenv("JWT_SECRET", "a:short,a:"+strings.Repeat("s", 20))
	_, err := execute("token", "--tenant", "acme", "--user", "alice")
	require.EqualError(t, err, "configuration:\n"+
		"JWT_SECRET: entry 1: secret must be at least 16 bytes, got 5\n"+
		"JWT_SECRET: entry 2: key id is already used by entry 1")
	t.Setenv("JWT_SECRET", "")
	_, err = execute("token", "--tenant", "acme", "--user", "alice")
	require.EqualError(t, err, "configuration:\nJWT_SECRET: required")
}
