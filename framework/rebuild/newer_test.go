package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// TestRebuildRefusesNewerEventVersion: a rebuild run by code older than an
// event in the log (a newer release wrote it) cannot build the table
// right; it fails at once naming the event, rather than waiting for newer
// code that will never run inside this rebuild. The live table stays.
func TestRebuildRefusesNewerEventVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.count(t, "t1", "a", 0, 3)
	_, err := eventstore.Append(ctx, b.db.Pool, eventstore.StreamRef{TenantID: "t1", Type: "s", ID: "new"}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: b.counted.Name(), TypeVersion: 2, Payload: []byte(`{"key":"a","count":9}`)}})
	require.NoError(t, err)
	b.db.WaitVisible(t)
	oid := b.oid(t, "tally")

	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = rebuild.Rebuild(rctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{BatchSize: 5})
	require.ErrorIs(t, err, framework.ErrNewerEventVersion)
	require.ErrorContains(t, err, "stored at version 2")
	require.Equal(t, oid, b.oid(t, "tally"))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
}
