package config

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestPoolSkipsConnectionsTheServerEnded: the pool built from PoolConfig
// does not hand out a connection whose backend the server ended while it
// sat idle (a restart, a crash, pg_terminate_backend), even one idle for
// less than pgxpool's one-second ping threshold: the statement runs on a
// fresh connection instead of failing, so a write never sends its COMMIT
// into a dead connection and is left in doubt.
func TestPoolSkipsConnectionsTheServerEnded(t *testing.T) {
	t.Parallel()
	c, err := FromLookup(env(minimal(map[string]string{"DATABASE_URL": kumikotest.AdminURL(), "DATABASE_POOL_MAX": "3"})))
	require.NoError(t, err)
	pc, err := c.PoolConfig()
	require.NoError(t, err)
	pc.ConnConfig.RuntimeParams["application_name"] = "kumiko-stale-pool-test"
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	require.NoError(t, err)
	defer pool.Close()
	admin, err := pgx.Connect(t.Context(), kumikotest.AdminURL())
	require.NoError(t, err)
	defer admin.Close(context.Background())

	for round := range 3 {
		// Three connections idle in the pool.
		var held []*pgxpool.Conn
		for range 3 {
			conn, err := pool.Acquire(t.Context())
			require.NoError(t, err)
			held = append(held, conn)
		}
		for _, conn := range held {
			conn.Release()
		}
		_, err = admin.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'kumiko-stale-pool-test'`)
		require.NoError(t, err)
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			require.NoError(t, admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'kumiko-stale-pool-test'`).Scan(&n))
			if n == 0 {
				break
			}
			require.True(t, time.Now().Before(deadline))
			time.Sleep(5 * time.Millisecond)
		}
		var one int
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT 1`).Scan(&one), "round %d", round)
	}
}
