package dispatcher_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/internal/proctest"
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

// TestPerInstanceRowRemovedUnderLiveProcess: the stale sweep of another
// process removes the per-instance row of a process that is alive but whose
// heartbeats stopped reaching the database (a broken connection, a
// partition). The live process re-creates the row at the cursor it last
// committed and goes on: every event, including those committed while the
// row was gone, is applied exactly once and in order (a row re-created at
// the log's current head would skip them), with a warning logged.
func TestPerInstanceRowRemovedUnderLiveProcess(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
	})
	ctx := context.Background()
	const name = "test:local"
	var logs proctest.Buffer
	live := newDispatcher(t, b, &dispatcher.Config{InstanceID: "api-1",
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	b.write(t, "t1", 0, 5, 2)
	drain(t, live, name, 5)
	before := state(t, b, name, "api-1")

	// Committed after the live process's last pass, before the removal.
	b.write(t, "t1", 5, 5, 2)
	b.db.WaitVisible(t)
	// api-1's heartbeats stopped 11 minutes ago; api-2's sweep removes its row.
	sweeper := newDispatcher(t, b, &dispatcher.Config{InstanceID: "api-2"})
	_, err := b.db.Pool.Exec(ctx, `UPDATE event_consumers SET heartbeat_at = now() - interval '11 minutes' WHERE instance_id = 'api-1'`)
	require.NoError(t, err)
	sweeper.Heartbeat(ctx)
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_consumers WHERE instance_id = 'api-1'`), "the sweep removed the row")

	// Committed while the row is gone.
	b.write(t, "t1", 10, 5, 2)
	drain(t, live, name, 10)

	rows, err := b.db.Pool.Query(ctx, `SELECT n FROM seen WHERE consumer = 'local' ORDER BY ctid`)
	require.NoError(t, err)
	ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	want := make([]int, 15)
	for i := range want {
		want[i] = i
	}
	require.Equal(t, want, ns, "every event once, in order")
	after := state(t, b, name, "api-1")
	require.Equal(t, "idle", after.status)
	require.Less(t, before.position, after.position)
	require.Equal(t, count(t, b, `SELECT max(position)::int FROM events`), int(after.position), "the row is at the last event")
	require.Contains(t, logs.String(), "consumer state row re-created")
}

// TestDeliveryBeforeLaterFailureResetsRevivals: a revived consumer that
// delivers the event it died on and then fails on a later event of the same
// pass has made progress: the revival budget starts over, so it is revived
// again after the cooldown ("at most MaxRevivals times in a row" counts
// revivals without a successful delivery in between).
func TestDeliveryBeforeLaterFailureResetsRevivals(t *testing.T) {
	t.Parallel()
	var failAt atomic.Int64 // the event that fails
	b := setup(t, func(b *bundle) {
		p := framework.MultiStreamProjection(b.f, "progressing", &framework.ProjectionOptions{MaxAttempts: 1})
		framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if int64(e.Payload.N) == failAt.Load() {
				return errors.New("down")
			}
			return nil
		})
	})
	const cooldown = 50 * time.Millisecond
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, ReviveCooldown: cooldown, MaxRevivals: 1})
	b.write(t, "t1", 0, 3, 1)
	b.db.WaitVisible(t)
	ctx := context.Background()
	const name = "test:progressing"

	// Dies on event 0 and uses its one revival.
	killOnce(t, b, d, name)
	time.Sleep(cooldown + 50*time.Millisecond)
	d.Revive(ctx)
	require.Equal(t, "idle", state(t, b, name, dispatcher.SharedInstance).status)
	require.Equal(t, 1, revivals(t, b, name))

	// Event 0 is delivered now; event 1 of the same pass fails.
	failAt.Store(1)
	killOnce(t, b, d, name)
	require.Equal(t, 1, count(t, b, `SELECT events_processed::int FROM event_consumers WHERE name = $1`, name),
		"event 0 was delivered before event 1 failed")
	require.Zero(t, revivals(t, b, name), "the delivery did not reset the revival count")
	time.Sleep(cooldown + 50*time.Millisecond)
	d.Revive(ctx)
	require.Equal(t, "idle", state(t, b, name, dispatcher.SharedInstance).status, "not revived although it made progress")
}
