package rebuild_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// TestAbandonProjectionNoLongerRebuildable: the leftover of a rebuild
// killed while its projection could be rebuilt (it has since become a saga,
// lost its Table, or shares it) pins retention like any leftover; abandon
// removes it, as it does for a projection no longer declared, while a
// rebuild of it is still refused.
func TestAbandonProjectionNoLongerRebuildable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	schema := rebuild.ShadowSchema("test:saga")
	_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %s; CREATE TABLE %s.saga_log (n int);
		INSERT INTO event_consumers (name, instance_id) VALUES ('test:saga#rebuild', '__shared__')`, schema, schema))
	require.NoError(t, err)
	found, err := rebuild.Abandon(ctx, b.db.Pool, b.reg, "test:saga")
	require.NoError(t, err)
	require.True(t, found)
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name = 'test:saga#rebuild'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema))
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:saga", nil)
	require.ErrorIs(t, err, rebuild.ErrNotRebuildable)
}
