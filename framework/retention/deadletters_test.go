package retention_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// TestPruneDeadLetters: event_dead_letters gains a row per event a
// SkipApplyErrors consumer or an operator's skip moves past, and nothing
// else removes them (also not those of consumers and instances long gone);
// PruneDeadLetters deletes the ones older than the cutoff and keeps the
// rest.
func TestPruneDeadLetters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `INSERT INTO event_dead_letters (consumer, instance_id, position, event_type, tenant_id, error, created_at) VALUES
  ('gone:projection', '__shared__', 1, 'test:event:ping', 'acme', 'boom', now() - interval '40 days'),
  ('system:consumer:sse-broadcast', 'api-old', 2, 'test:event:ping', 'acme', 'boom', now() - interval '31 days'),
  ('live:projection', '__shared__', 3, 'test:event:ping', 'acme', 'boom', now() - interval '29 days')`)
	require.NoError(t, err)

	for _, days := range []int{0, retention.MaxOlderThanDays + 1} {
		_, err = retention.PruneDeadLetters(ctx, db.Pool, days)
		require.ErrorIs(t, err, retention.ErrBadAge)
	}
	n, err := retention.PruneDeadLetters(ctx, db.Pool, 30)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	var left []string
	rows, err := db.Pool.Query(ctx, `SELECT consumer FROM event_dead_letters ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		left = append(left, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"live:projection"}, left)
}
