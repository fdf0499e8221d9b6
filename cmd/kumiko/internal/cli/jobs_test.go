package cli_test

import (
	"net"
	"os/exec"
	"path/filepath"
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
	bin := filepath.Join(t.TempDir(), "kumiko")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/kumiko-go/kumiko/cmd/kumiko").CombinedOutput()
	require.NoError(t, err, string(out))
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
		require.Equal(t, 1, strings.Count(stderr, "\n"), "%v: one line: %q", args, stderr)
	}
}
