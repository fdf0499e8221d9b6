package cli_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
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
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "kumiko_cli_create_" + hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		_ = admin.Close(ctx)
	})

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
