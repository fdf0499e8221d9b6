package dispatcher_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

func revivals(t *testing.T, b *bundle, name string) int {
	t.Helper()
	return count(t, b, `SELECT revivals FROM event_consumers WHERE name = $1`, name)
}

// killOnce runs passes until the consumer is dead.
func killOnce(t *testing.T, b *bundle, d *dispatcher.Dispatcher, name string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for state(t, b, name, dispatcher.SharedInstance).status != "dead" {
		require.True(t, time.Now().Before(deadline), "consumer never died")
		_, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		time.Sleep(2 * time.Millisecond)
	}
}

func TestDeadConsumerRevivedAfterCooldownAtMostMaxRevivals(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	b := setup(t, func(b *bundle) {
		p := framework.MultiStreamProjection(b.f, "fragile", &framework.ProjectionOptions{MaxAttempts: 1})
		framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if failing.Load() {
				return errors.New("down")
			}
			return nil
		})
	})
	const cooldown = 300 * time.Millisecond
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, ReviveCooldown: cooldown, MaxRevivals: 2})
	b.write(t, "t1", 0, 2, 1)
	ctx := context.Background()
	const name = "test:fragile"

	for round := 1; round <= 2; round++ {
		killOnce(t, b, d, name)
		d.Revive(ctx)
		require.Equal(t, "dead", state(t, b, name, dispatcher.SharedInstance).status, "round %d: revived within the cooldown", round)
		time.Sleep(cooldown + 100*time.Millisecond)
		d.Revive(ctx)
		require.Equal(t, "idle", state(t, b, name, dispatcher.SharedInstance).status, "round %d: not revived after the cooldown", round)
		require.Equal(t, round, revivals(t, b, name))
	}
	// The cap: a third death stays dead.
	killOnce(t, b, d, name)
	time.Sleep(cooldown + 100*time.Millisecond)
	d.Revive(ctx)
	require.Equal(t, "dead", state(t, b, name, dispatcher.SharedInstance).status, "revived past MaxRevivals")

	// An operator restart and a successful delivery reset the count.
	failing.Store(false)
	require.NoError(t, dispatcher.Restart(ctx, b.db.Pool, name, ""))
	drain(t, d, name, 2)
	require.Zero(t, revivals(t, b, name))
}

func TestStaleInstanceRowsRemovedByHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
		recorder(b, "shared", nil)
	})
	ctx := context.Background()
	gone := newDispatcher(t, b, &dispatcher.Config{InstanceID: "gone"})
	_ = gone
	live := newDispatcher(t, b, &dispatcher.Config{InstanceID: "live", StaleInstanceAfter: time.Minute})
	// "gone" fell silent 2 minutes ago; the shared row is old too.
	_, err := b.db.Pool.Exec(ctx, `UPDATE event_consumers SET heartbeat_at = now() - interval '2 minutes' WHERE instance_id IN ('gone', '__shared__')`)
	require.NoError(t, err)
	live.Heartbeat(ctx)
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_consumers WHERE instance_id = 'gone'`), "the silent instance's row stays")
	require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_consumers WHERE instance_id = 'live'`))
	require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_consumers WHERE instance_id = '__shared__'`), "shared rows are never removed")
	require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_consumers WHERE instance_id = 'live' AND heartbeat_at > now() - interval '10 seconds'`))
}
