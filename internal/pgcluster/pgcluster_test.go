package pgcluster_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/internal/pgcluster"
)

// TestRestartKeepsData: a server stopped with Stop leaves a clean data
// directory that pg_controldata reports shut down and that starts again
// with its data.
func TestRestartKeepsData(t *testing.T) {
	t.Parallel()
	d := pgcluster.New(t)
	dir := d.InitDB("data")
	s := d.Start(dir)
	count := func(s *pgcluster.Server, sql string) int {
		conn, err := pgx.Connect(t.Context(), s.URL("postgres"))
		require.NoError(t, err)
		defer conn.Close(t.Context())
		var n int
		require.NoError(t, conn.QueryRow(t.Context(), sql).Scan(&n))
		return n
	}
	conn, err := pgx.Connect(t.Context(), s.URL("postgres"))
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), `CREATE TABLE kept AS SELECT 1 AS x`)
	require.NoError(t, err)
	require.NoError(t, conn.Close(t.Context()))
	s.Stop()
	s.Stop()
	require.Contains(t, d.Run("pg_controldata", dir), "Database cluster state:               shut down")
	s = d.Start(dir)
	require.Equal(t, 1, count(s, `SELECT count(*) FROM kept`))
}
