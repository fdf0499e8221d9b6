package retention_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// TestPruneKeepsEventsBehindALateCommit: transaction A appends a ping
// (the lower position) and stays open while B appends one and commits. B's
// event is old enough to prune and visible, but no consumer can have seen
// it (A holds the horizon below it): the prune refuses and deletes nothing.
// A's event, invisible to the prune, is not deleted either. Once A commits
// and the consumer has delivered both, in commit order, the prune deletes
// them.
func TestPruneKeepsEventsBehindALateCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { listener(b, "pings", b.ping, nil) })
	ctx := context.Background()
	d := newDispatcher(t, b)

	a, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = a.Rollback(ctx) }()
	_, err = eventstore.Append(ctx, a, eventstore.StreamRef{TenantID: "t1", Type: "s", ID: "late"}, eventstore.AnyVersion,
		[]eventstore.NewEvent{{Type: pingType, TypeVersion: 1, Payload: []byte(`{"n":1}`)}})
	require.NoError(t, err)
	b.write(t, b.ping, "early", 1)
	b.age(t, pingType)
	n, err := d.RunOnce(ctx, "test:pings")
	require.NoError(t, err)
	require.Zero(t, n, "B's event lies above the horizon A holds")

	_, err = prune(t, b, &retention.Options{})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	require.Len(t, lag.Consumers, 1)
	require.Equal(t, "test:pings", lag.Consumers[0].Name)
	require.Equal(t, 1, b.events(t, pingType))

	require.NoError(t, a.Commit(ctx))
	b.age(t, pingType)
	drain(t, b, d, "test:pings", 2)
	res, err := prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Counts[pingType])
	require.Zero(t, b.events(t, pingType))
}
