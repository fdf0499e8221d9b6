package retention_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// TestPruneHoldsForDeclaredConsumerWithoutRow: a projection a new release
// adds has no state row until a process of that release starts and
// registers it at the start of the log. A prune run with the new binary
// before that (a cron during a deploy) must not delete the events the
// projection will deliver from the start: it counts as sitting at the
// start of the log with its declared types.
func TestPruneHoldsForDeclaredConsumerWithoutRow(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { listener(b, "late", b.ping, nil) })
	b.write(t, b.ping, "a", 3)
	b.age(t, pingType)

	for _, dry := range []bool{true, false} {
		_, err := prune(t, b, &retention.Options{DryRun: dry})
		var lag *retention.LagError
		require.ErrorAs(t, err, &lag, "dry run %v", dry)
		require.Len(t, lag.Consumers, 1)
		require.Equal(t, "test:late", lag.Consumers[0].Name)
		require.Equal(t, "__shared__", lag.Consumers[0].InstanceID)
		require.Equal(t, retention.StatusUnregistered, lag.Consumers[0].Status)
		require.Equal(t, int64(3), lag.Consumers[0].Unseen)
		require.ErrorContains(t, err, "not registered yet")
		require.Equal(t, 3, b.events(t, pingType))
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM event_consumers`), "a prune registers no consumer")

	// The process of the release starts: the projection delivers them.
	d := newDispatcher(t, b)
	drain(t, b, d, "test:late", 3)
	res, err := prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Total)
}

// TestPruneHoldsForDeclaredPartitionedConsumerWithoutRow: a partitioned
// projection's rows are name@i; none of them exists yet.
func TestPruneHoldsForDeclaredPartitionedConsumerWithoutRow(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { listener(b, "parts", b.ping, &framework.ProjectionOptions{Partitions: 3}) })
	b.write(t, b.ping, "a", 2)
	b.write(t, b.ping, "b", 2)
	b.age(t, pingType)
	_, err := prune(t, b, &retention.Options{})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	require.Equal(t, "test:parts", lag.Consumers[0].Name)
	require.Equal(t, int64(4), lag.Consumers[0].Unseen)
	require.Equal(t, 4, b.events(t, pingType))

	// Registered (every partition at the start), the rows hold instead.
	newDispatcher(t, b)
	_, err = prune(t, b, &retention.Options{})
	require.ErrorAs(t, err, &lag)
	for _, c := range lag.Consumers {
		require.NotEqual(t, retention.StatusUnregistered, c.Status)
	}
}

// TestPruneHoldsForTypesARowDoesNotListYet: a release that adds a type to
// an existing projection delivers that type's events after the row's
// cursor once it registers (the row's types are the last process's). The
// prune, run with that release before, must hold them back too.
func TestPruneHoldsForTypesARowDoesNotListYet(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		p := framework.MultiStreamProjection(b.f, "wider", nil)
		framework.On(p, b.pong, func(context.Context, *framework.Tx, framework.Event[ping]) error { return nil })
		framework.On(p, b.ping, func(context.Context, *framework.Tx, framework.Event[ping]) error { return nil })
	})
	// The old release's row: pong only, at the start of the log.
	_, err := b.db.Pool.Exec(context.Background(),
		`INSERT INTO event_consumers (name, instance_id, event_types) VALUES ('test:wider', '__shared__', '{test:event:pong}')`)
	require.NoError(t, err)
	b.write(t, b.ping, "a", 2)
	b.age(t, pingType)
	_, err = prune(t, b, &retention.Options{Types: []string{pingType}})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	require.Equal(t, "test:wider", lag.Consumers[0].Name)
	require.Equal(t, "idle", lag.Consumers[0].Status)
	require.Equal(t, 2, b.events(t, pingType))
}

// TestPruneHoldsForJobTriggerWithoutRow: an application that first gets
// jobs writes dispatch events from its API processes before any worker has
// registered the job-trigger consumer (made at the start of the log so
// that none is lost); a prune of the pub/sub types must keep them.
func TestPruneHoldsForJobTriggerWithoutRow(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.OnEvent(b.f, "on-ping", b.ping, nil, func(context.Context, *jobs.Context, framework.Event[ping]) error { return nil })
	})
	b.write(t, b.ping, "a", 2)
	b.age(t, pingType)
	_, err := prune(t, b, &retention.Options{Types: []string{pingType}})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	require.Equal(t, jobs.ConsumerName, lag.Consumers[0].Name)
	require.Equal(t, 2, b.events(t, pingType))
}
