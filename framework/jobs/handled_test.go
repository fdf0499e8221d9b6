package jobs_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestPruneHandled: the handled table grows by one row per HandledOnce
// claim and nothing else removes them; PruneHandled deletes the claims older
// than the cutoff, of every tenant, and keeps the younger ones, whose
// effects still happen only once.
func TestPruneHandled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	claim := claimer(t, db)
	for _, k := range []struct{ tenant, key string }{{"acme", "old-1"}, {"globex", "old-2"}, {"acme", "new"}} {
		require.True(t, claim(k.tenant, k.key))
	}
	_, err := db.Pool.Exec(ctx, `UPDATE handled SET handled_at = now() - interval '91 days' WHERE key LIKE 'old-%'`)
	require.NoError(t, err)

	_, err = jobs.PruneHandled(ctx, db.Pool, 0)
	require.ErrorIs(t, err, jobs.ErrBadAge)

	n, err := jobs.PruneHandled(ctx, db.Pool, 90)
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	var left []string
	rows, err := db.Pool.Query(ctx, `SELECT tenant_id || '/' || key FROM handled ORDER BY 1`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		left = append(left, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"acme/new"}, left)
	require.False(t, claim("acme", "new"), "a kept claim still guards its effect")

	n, err = jobs.PruneHandled(ctx, db.Pool, 90)
	require.NoError(t, err)
	require.Zero(t, n, "a second prune finds nothing")
}

// TestHandledOnceTakesALongKey: a key longer than a btree entry may be
// (about 2.7 KB, less for text that compresses badly) failed every claim
// with "index row size exceeds maximum", so the job failed on every attempt
// and was archived. Long keys are kept by their hash; two different long
// keys sharing a prefix stay apart.
func TestHandledOnceTakesALongKey(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	claimAs := claimer(t, db)
	claim := func(key string) bool { return claimAs("acme", key) }
	random := make([]byte, 3000)
	_, _ = rand.Read(random)
	long := "mail:" + base64.StdEncoding.EncodeToString(random) // about 4 KB that does not compress
	require.True(t, claim(long))
	require.False(t, claim(long), "the long key's effect happens once")
	require.True(t, claim(long+"x"), "another long key is another claim")
	require.True(t, claim(long[:jobs.MaxHandledKeyLength]), "a key of the longest length kept as it is")
	require.False(t, claim(long[:jobs.MaxHandledKeyLength]))
}

// TestHandledOnceKeepsAnEarlierLongClaim: before long keys were hashed, a
// key of 513 bytes up to a btree entry's limit was stored as it is; such a
// claim, made by the earlier release and kept (for the 90 days an archived
// run may be retried), still guards its effect. It was claimed afresh under
// the key's hash, so the effect repeated after the upgrade.
func TestHandledOnceKeepsAnEarlierLongClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	claim := claimer(t, db)
	random := make([]byte, 1500)
	_, _ = rand.Read(random)
	long := "mail:" + base64.StdEncoding.EncodeToString(random) // 2005 bytes, under the btree limit
	// The earlier release's claim: the key as it is.
	_, err := db.Pool.Exec(ctx, `INSERT INTO handled (tenant_id, key) VALUES ('acme', $1)`, long)
	require.NoError(t, err)

	require.False(t, claim("acme", long), "the earlier release's claim guards the effect")
	require.True(t, claim("globex", long), "another tenant's key is another claim")
	require.False(t, claim("globex", long))
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM handled WHERE tenant_id = 'acme'`).Scan(&n))
	require.Equal(t, 1, n, "no second claim beside the earlier one")
}

// claimer returns a function that claims key for tenant with HandledOnce
// in a transaction of its own on db, and reports whether it was the first
// claim.
func claimer(t *testing.T, db *kumikotest.DB) func(tenant, key string) bool {
	t.Helper()
	rt, err := framework.NewRuntime(framework.NewRegistry(), db.Pool, nil)
	require.NoError(t, err)
	return func(tenant, key string) bool {
		t.Helper()
		var first bool
		_, err := rt.InTx(context.Background(), tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			var err error
			first, err = jobs.HandledOnce(ctx, tx, key)
			return err
		})
		require.NoError(t, err)
		return first
	}
}
