package config

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestKeywordValueStartingWithARuntimeParameter: in the keyword/value form
// pgx sends every setting it does not know as a run-time parameter, and
// Postgres takes a custom one by its dotted name ("app.region=eu host=db
// ..."). Such a string whose first setting is dotted is a PostgreSQL
// connection string all the same: it boots, and the session has the
// setting.
func TestKeywordValueStartingWithARuntimeParameter(t *testing.T) {
	t.Parallel()
	admin, err := pgconn.ParseConfig(kumikotest.AdminURL())
	require.NoError(t, err)
	kv := fmt.Sprintf("kumiko_test.region=eu host=%s port=%d user=%s dbname=%s",
		admin.Host, admin.Port, admin.User, admin.Database)
	c, err := FromLookup(env(minimal(map[string]string{"DATABASE_URL": kv, "DATABASE_READ_URL": kv})))
	require.NoError(t, err)
	for _, pool := range []func() (*pgxpool.Config, error){c.PoolConfig, c.ReadPoolConfig} {
		pc, err := pool()
		require.NoError(t, err)
		conn, err := pgx.ConnectConfig(t.Context(), pc.ConnConfig)
		require.NoError(t, err)
		var region string
		require.NoError(t, conn.QueryRow(t.Context(), `SELECT current_setting('kumiko_test.region')`).Scan(&region))
		require.NoError(t, conn.Close(t.Context()))
		require.Equal(t, "eu", region)
	}
}
