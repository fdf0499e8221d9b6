package pgcluster_test

import (
	"os"
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

// TestStartOnTheSamePortAfterACrash: a server crashed with Crash leaves a
// data directory that is not shut down cleanly; StartOn serves it again on
// the old port, so a pool keeping the old URL reconnects, after crash
// recovery has replayed the committed rows.
func TestStartOnTheSamePortAfterACrash(t *testing.T) {
	t.Parallel()
	d := pgcluster.New(t)
	dir := d.InitDB("data")
	s := d.Start(dir)
	url := s.URL("postgres")
	conn, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer func() { _ = conn.Close(t.Context()) }()
	_, err = conn.Exec(t.Context(), `CREATE TABLE kept AS SELECT 1 AS x`)
	require.NoError(t, err)

	s.Crash()
	s.Crash()
	require.Error(t, conn.Ping(t.Context()), "the crash ended the connection")
	require.Contains(t, d.Run("pg_controldata", dir), "Database cluster state:               in production",
		"an immediate shutdown leaves no shutdown checkpoint")

	s2 := d.StartOn(dir, s.Port)
	require.Equal(t, s.Port, s2.Port)
	require.Equal(t, url, s2.URL("postgres"))
	log, err := os.ReadFile(s2.Log)
	require.NoError(t, err)
	require.Contains(t, string(log), "was not properly shut down; automatic recovery in progress")
	conn2, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer conn2.Close(t.Context())
	var n int
	require.NoError(t, conn2.QueryRow(t.Context(), `SELECT count(*) FROM kept`).Scan(&n))
	require.Equal(t, 1, n)
}
