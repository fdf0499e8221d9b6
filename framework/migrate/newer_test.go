package migrate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
)

// A database migrated by a newer release holds migrations this binary does
// not know. goose only ever looks at the binary's own migrations, so `up`
// answered "applied 0" and `status` listed everything as applied, as if
// the schema were the binary's. Unknown names the versions it does not
// know, so the CLI can say so; a migration rolled back since (goose's
// legacy down marks a row not applied) is not among them.
func TestUnknownNamesANewerReleasesMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	unknown, err := migrate.Unknown(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, unknown, "a database migrated by this binary")

	_, err = db.Pool.Exec(ctx, `INSERT INTO goose_db_version (version_id, is_applied) VALUES (99001, true), (99003, true), (99002, true), (99002, false)`)
	require.NoError(t, err)
	unknown, err = migrate.Unknown(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Equal(t, []int64{99001, 99003}, unknown)
	require.NoError(t, migrate.Check(ctx, db.Pool, nil), "the binary's own migrations are all applied")

	// A database nobody migrated yet has no version table: nothing unknown.
	_, err = db.Pool.Exec(ctx, `DROP TABLE goose_db_version`)
	require.NoError(t, err)
	unknown, err = migrate.Unknown(ctx, db.Pool, nil)
	require.NoError(t, err)
	require.Empty(t, unknown)
}
