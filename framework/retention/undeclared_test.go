package retention_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// TestPruneTypeNoLongerDeclared: events of a type the code no longer
// declares (its feature was removed or renamed) stay in the log; naming the
// type must prune them, or nothing ever could. A name that is neither
// declared nor in the log (a typo) is still refused, and the consumer check
// holds for the old type too.
func TestPruneTypeNoLongerDeclared(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	const gone = "removed:event:notice"
	_, err := eventstore.Append(ctx, b.db.Pool, eventstore.StreamRef{TenantID: "t1", Type: "notice", ID: "n1"}, eventstore.AnyVersion,
		[]eventstore.NewEvent{{Type: gone, TypeVersion: 1, Payload: []byte(`{}`)}, {Type: gone, TypeVersion: 1, Payload: []byte(`{}`)}})
	require.NoError(t, err)
	b.age(t, gone)

	_, err = prune(t, b, &retention.Options{Types: []string{gone, "removed:event:typo"}})
	require.ErrorIs(t, err, retention.ErrUnknownType)
	require.ErrorContains(t, err, "removed:event:typo")
	require.NotContains(t, err.Error(), gone+",")
	require.Equal(t, 2, b.events(t, gone))

	// A consumer reading every type (an SSE broadcast, a catch-all) that
	// has not passed them holds them back.
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO event_consumers (name, instance_id) VALUES ('catch-all', '__shared__')`)
	require.NoError(t, err)
	_, err = prune(t, b, &retention.Options{Types: []string{gone}})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	require.Equal(t, 2, b.events(t, gone))
	_, err = b.db.Pool.Exec(ctx, `UPDATE event_consumers SET status = 'disabled' WHERE name = 'catch-all'`)
	require.NoError(t, err)

	res, err := prune(t, b, &retention.Options{Types: []string{gone}})
	require.NoError(t, err)
	require.Equal(t, []string{gone}, res.Types)
	require.Equal(t, int64(2), res.Total)
	require.Zero(t, b.events(t, gone))
}
