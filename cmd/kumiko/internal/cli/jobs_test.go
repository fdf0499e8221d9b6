package cli_test

import (
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestJobsCommandsWithRedisDown: `kumiko jobs list` and `kumiko jobs retry`
// run as a real binary against a Redis that refuses connections exit with
// code 1 and print the command's one error line, not go-redis's own log
// lines ("redis: 2006/01/02 15:04:05 pool.go:...: failed to dial") before it.
func TestJobsCommandsWithRedisDown(t *testing.T) {
	t.Parallel()
	bin := buildKumiko(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	env := []string{
		"REDIS_URL=redis://" + addr + "/0",
		"DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres",
	}
	for _, args := range [][]string{{"jobs", "list"}, {"jobs", "retry", "some-id"}} {
		stdout, stderr, code := runKumiko(t, bin, env, args...)
		require.Equal(t, 1, code, args)
		require.Empty(t, stdout, args)
		require.True(t, strings.HasPrefix(stderr, "kumiko: jobs: "), "%v: %q", args, stderr)
		require.Contains(t, stderr, "connection refused", args)
		require.NotContains(t, stderr, "UNKNOWN", "%v: asynq's nested error codes", args)
		require.Equal(t, 1, strings.Count(stderr, "\n"), "%v: one line: %q", args, stderr)
	}
}

// TestJobsDeclaredScheduleFromConfiguration: `kumiko jobs declared` lists
// the sample nightly report on the schedule the configuration gives it
// (KUMIKO_SAMPLE_CRON, else every minute with KUMIKO_DEV, else 02:00 UTC),
// and a bad KUMIKO_SAMPLE_CRON is a configuration problem reported with the
// others, not a registration problem found after them.
func TestJobsDeclaredScheduleFromConfiguration(t *testing.T) {
	t.Parallel()
	bin := buildKumiko(t)
	db := "DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres"
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"KUMIKO_SAMPLE_CRON=", "KUMIKO_DEV="}, "0 2 * * *"},
		{[]string{"KUMIKO_SAMPLE_CRON=", "KUMIKO_DEV=1"}, "*/1 * * * *"},
		{[]string{"KUMIKO_SAMPLE_CRON=@every 2s", "KUMIKO_DEV=1"}, "@every 2s"},
	} {
		stdout, stderr, code := runKumiko(t, bin, append(tc.env, db), "jobs", "declared")
		require.Equal(t, 0, code, stderr)
		require.Regexp(t, `(?m)^users:job:nightly-report +cron `+regexp.QuoteMeta(tc.want)+` +worker `, stdout, tc.env)
	}

	stdout, stderr, code := runKumiko(t, bin, []string{db, "KUMIKO_SAMPLE_CRON=61 * * * *", "DATABASE_POOL_MAX=abc"}, "jobs", "declared")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Equal(t, "kumiko: configuration:\n"+
		"DATABASE_POOL_MAX: must be a positive integer, got \"abc\"\n"+
		"KUMIKO_SAMPLE_CRON: must be a cron spec such as \"0 2 * * *\" or \"@every 2s\", got \"61 * * * *\": end of range (61) above maximum (59): 61\n",
		stderr)
}

// buildKumiko builds the kumiko binary into a temporary directory.
func buildKumiko(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kumiko")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kumiko-go/kumiko/cmd/kumiko").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// TestJobsDeclaredWithoutDatabase: `kumiko jobs declared` lists the code's
// jobs and opens no database, so, as before it read the configuration, it
// runs without DATABASE_URL (in CI, on a laptop); the variables it does
// read are still checked.
func TestJobsDeclaredWithoutDatabase(t *testing.T) {
	t.Parallel()
	bin := buildKumiko(t)
	stdout, stderr, code := runKumiko(t, bin, []string{"DATABASE_URL=", "KUMIKO_SAMPLE_CRON=@every 2s"}, "jobs", "declared")
	require.Equal(t, 0, code, stderr)
	require.Regexp(t, `(?m)^users:job:nightly-report +cron @every 2s +worker `, stdout)

	stdout, stderr, code = runKumiko(t, bin, []string{"DATABASE_URL=", "KUMIKO_SAMPLE_CRON=61 * * * *"}, "jobs", "declared")
	require.Equal(t, 1, code)
	require.Empty(t, stdout)
	require.Equal(t, "kumiko: configuration:\n"+
		"KUMIKO_SAMPLE_CRON: must be a cron spec such as \"0 2 * * *\" or \"@every 2s\", got \"61 * * * *\": end of range (61) above maximum (59): 61\n",
		stderr)
}
