package dispatcher_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestHandlerThatDeadlocksEveryTimeTurnsDead: a pass the database picks as
// a deadlock victim is lost, not its event's failure (see
// TestLostPassIsNoFailureOfItsEvent), but a handler that deadlocks every
// time, by its own making, retried that event for ever: the consumer never
// turned dead and SkipApplyErrors never moved past it. After
// dispatcher.VictimRetries victim losses of the same event in a row, each
// further one counts as an attempt: the strict consumer turns dead at
// MaxAttempts, the skipping one dead-letters the event and goes on.
//
// The handler makes a real deadlock: the pass takes advisory lock 1, a
// second connection of its own takes lock 2, then each waits for the
// other's. The second connection's deadlock_timeout is 10s, so the pass
// (the server's default, 1s) detects the cycle and is its victim.
func TestHandlerThatDeadlocksEveryTimeTurnsDead(t *testing.T) {
	t.Parallel()
	var b *bundle
	deadlock := func(ctx context.Context, tx *framework.Tx, key int64) error {
		conn, err := b.db.Pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		other, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = other.Rollback(context.WithoutCancel(ctx)) }()
		var pid int
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid() FROM pg_advisory_xact_lock($1)`, key).Scan(&pid); err != nil {
			return err
		}
		var otherPid int
		if err := other.QueryRow(ctx, `SELECT pg_backend_pid(), set_config('deadlock_timeout', '10s', true)`).Scan(&otherPid, nil); err != nil {
			return err
		}
		if _, err := other.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key+1); err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			// Once the pass waits for lock 2, ask for lock 1: a cycle.
			for {
				var waiting bool
				if err := b.db.Pool.QueryRow(ctx, `SELECT wait_event_type IS NOT DISTINCT FROM 'Lock' FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
					done <- err
					return
				}
				if waiting {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			_, err := other.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key)
			done <- err
		}()
		_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, key+1)
		if err == nil {
			return errors.New("no deadlock")
		}
		// The pass is the victim. The second connection would get lock 1
		// only once the dispatcher rolls the pass back, after the handler
		// returns: end its wait instead.
		if _, cerr := b.db.Pool.Exec(context.WithoutCancel(ctx), `SELECT pg_cancel_backend($1)`, otherPid); cerr != nil {
			return cerr
		}
		<-done
		return err
	}
	b = setup(t, func(b *bundle) {
		strict := framework.MultiStreamProjection(b.f, "strict", &framework.ProjectionOptions{MaxAttempts: 2})
		framework.On(strict, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			return deadlock(ctx, tx, 100)
		})
		skip := framework.MultiStreamProjection(b.f, "skip", &framework.ProjectionOptions{SkipApplyErrors: true})
		framework.On(skip, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			return deadlock(ctx, tx, 200)
		})
	})
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, RetryMaxDelay: time.Millisecond})
	b.write(t, "t1", 0, 1, 1)
	b.db.WaitVisible(t)

	run := func(name string) {
		t.Helper()
		_, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err, name)
		time.Sleep(3 * time.Millisecond) // past the backoff
	}
	// The first VictimRetries losses are retried without counting.
	for i := range dispatcher.VictimRetries {
		run("test:strict")
		st := state(t, b, "test:strict", dispatcher.SharedInstance)
		require.Equal(t, "idle", st.status, "loss %d: %+v", i+1, st)
		require.Zero(t, st.attempts, "loss %d", i+1)
		require.NotNil(t, st.lastErr)
		require.True(t, strings.HasPrefix(*st.lastErr, dispatcher.PassLost), "%q", *st.lastErr)
		require.Contains(t, *st.lastErr, "deadlock detected")
	}
	// Then each counts: MaxAttempts 2 is reached with the second.
	run("test:strict")
	st := state(t, b, "test:strict", dispatcher.SharedInstance)
	require.Equal(t, "idle", st.status, "%+v", st)
	require.Equal(t, 1, st.attempts)
	require.False(t, strings.HasPrefix(*st.lastErr, dispatcher.PassLost), "%q", *st.lastErr)
	run("test:strict")
	st = state(t, b, "test:strict", dispatcher.SharedInstance)
	require.Equal(t, "dead", st.status, "%+v", st)
	require.Equal(t, 2, st.attempts)
	require.Contains(t, *st.lastErr, "deadlock detected")

	for i := range dispatcher.VictimRetries {
		run("test:skip")
		require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = 'test:skip'`), "loss %d dead-lettered", i+1)
	}
	run("test:skip")
	require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = 'test:skip' AND error LIKE '%deadlock detected%'`))
	st = state(t, b, "test:skip", dispatcher.SharedInstance)
	require.Equal(t, "idle", st.status)
	require.Equal(t, int64(count(t, b, `SELECT max(position) FROM events`)), st.position, "moved past the event")
}
