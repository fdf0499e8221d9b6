package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestVerbDuringALongPruneIsBusyNotAnInternalError: an events prune holds
// event_consumers in SHARE mode until it commits. A verb waiting that out
// beyond its lock timeout failed with the bare lock_timeout error (a 500
// internal error over HTTP); it is ErrConsumerBusy (409) and says why.
func TestVerbDuringALongPruneIsBusyNotAnInternalError(t *testing.T) {
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	ctx := context.Background()
	newDispatcher(t, b, nil)
	dispatcher.SetOpsLockTimeout(t, 200*time.Millisecond)

	// What retention.Prune holds while it checks and deletes.
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE event_consumers IN SHARE MODE`)
	require.NoError(t, err)

	for _, verb := range []func() error{
		func() error { return dispatcher.Disable(ctx, b.db.Pool, "test:a", "") },
		func() error {
			_, err := dispatcher.Rewind(ctx, b.db.Pool, "test:a", "", dispatcher.RewindTo{})
			return err
		},
	} {
		err := verb()
		require.ErrorIs(t, err, dispatcher.ErrConsumerBusy)
		require.EqualError(t, err, "consumer test:a: the consumer table stayed locked for 200ms (an events prune is running?); try again")
	}
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, dispatcher.Disable(ctx, b.db.Pool, "test:a", ""))
}

// TestRemoveInstanceDuringALongPruneIsBusy: RemoveInstance waited without
// a bound for a prune's lock on event_consumers (an HTTP DELETE hung as
// long); like the other verbs it gives up after the ops lock timeout.
func TestRemoveInstanceDuringALongPruneIsBusy(t *testing.T) {
	b := setup(t, func(b *bundle) {
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
	})
	ctx := context.Background()
	_ = opsDispatcher(t, b, "pod-1")
	_, err := b.db.Pool.Exec(ctx, `UPDATE event_consumers SET heartbeat_at = now() - interval '2 minutes' WHERE instance_id = 'pod-1'`)
	require.NoError(t, err)
	dispatcher.SetOpsLockTimeout(t, 200*time.Millisecond)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `LOCK TABLE event_consumers IN SHARE MODE`)
	require.NoError(t, err)

	_, err = dispatcher.RemoveInstance(ctx, b.db.Pool, "pod-1")
	require.ErrorIs(t, err, dispatcher.ErrConsumerBusy)
	require.EqualError(t, err, "instance pod-1: the consumer table stayed locked for 200ms (an events prune is running?); try again")
	require.NoError(t, tx.Rollback(ctx))
	n, err := dispatcher.RemoveInstance(ctx, b.db.Pool, "pod-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}
