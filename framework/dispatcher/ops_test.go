package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// flaky registers a projection that records every event in seen and fails
// on the event whose N equals poison (-1: never).
func flaky(b *bundle, name string, opts *framework.ProjectionOptions, poison *atomic.Int64) {
	p := framework.MultiStreamProjection(b.f, name, opts)
	framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, $2, $3, $4, '', '')`, tx.TenantID(), name, e.ID, e.Payload.N); err != nil {
			return err
		}
		if int64(e.Payload.N) == poison.Load() {
			return errors.New("poison pill")
		}
		return nil
	})
}

func poisonAt(n int64) *atomic.Int64 {
	var p atomic.Int64
	p.Store(n)
	return &p
}

// opsDispatcher retries failed events at once, so tests reach dead quickly.
func opsDispatcher(t *testing.T, b *bundle, instance string) *dispatcher.Dispatcher {
	t.Helper()
	return newDispatcher(t, b, &dispatcher.Config{InstanceID: instance, RetryBaseDelay: time.Millisecond, RetryMaxDelay: 2 * time.Millisecond})
}

// untilDead runs passes until the consumer's row is dead.
func untilDead(t *testing.T, b *bundle, d *dispatcher.Dispatcher, name, instance string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for state(t, b, name, instance).status != "dead" {
		require.True(t, time.Now().Before(deadline), "consumer %s never turned dead", name)
		_, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		time.Sleep(3 * time.Millisecond)
	}
}

// seenNs returns the N of every event the consumer applied, in order.
func seenNs(t *testing.T, b *bundle, consumer string) []int {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT n FROM seen WHERE consumer = $1 ORDER BY ctid`, consumer)
	require.NoError(t, err)
	var ns []int
	for rows.Next() {
		var n int
		require.NoError(t, rows.Scan(&n))
		ns = append(ns, n)
	}
	require.NoError(t, rows.Err())
	return ns
}

// logOrder returns the events' cursors in delivery order and their N.
func logOrder(t *testing.T, b *bundle) ([]eventstore.Cursor, []int) {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT commit_key, position, (payload->>'n')::int FROM events ORDER BY commit_key, position`)
	require.NoError(t, err)
	var cs []eventstore.Cursor
	var ns []int
	for rows.Next() {
		var c eventstore.Cursor
		var n int
		require.NoError(t, rows.Scan(&c.CommitKey, &c.Position, &n))
		cs = append(cs, c)
		ns = append(ns, n)
	}
	require.NoError(t, rows.Err())
	return cs, ns
}

// positionOf returns the position of the event with payload n.
func positionOf(t *testing.T, b *bundle, n int) int64 {
	t.Helper()
	var p int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT position FROM events WHERE (payload->>'n')::int = $1`, n).Scan(&p))
	return p
}

func status(t *testing.T, b *bundle, name, instance string) dispatcher.ConsumerStatus {
	t.Helper()
	st, err := dispatcher.Status(context.Background(), b.db.Pool, name, instance)
	require.NoError(t, err)
	return st
}

// requireRefused asserts a *StateError with the given states.
func requireRefused(t *testing.T, err error, verb string, have dispatcher.State, want string) {
	t.Helper()
	var se *dispatcher.StateError
	require.ErrorAs(t, err, &se)
	require.Equal(t, verb, se.Verb)
	require.Equal(t, have, se.Status)
	require.Equal(t, want, se.Want)
}

func TestListShowsEveryRowWithCursorAndLag(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "shared", nil)
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
	})
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 6, 2)
	drain(t, d, "test:shared", 6)
	b.write(t, "t1", 6, 4, 2)

	list, err := dispatcher.List(context.Background(), b.db.Pool)
	require.NoError(t, err)
	require.Len(t, list, 2)
	local, shared := list[0], list[1]
	require.Equal(t, "test:local", local.Name)
	require.Equal(t, "pod-1", local.InstanceID)
	require.Equal(t, dispatcher.StateIdle, local.Status)
	require.Equal(t, eventstore.Cursor{}, local.Cursor)
	require.EqualValues(t, 10, local.Lag)
	require.Equal(t, "test:shared", shared.Name)
	require.Equal(t, dispatcher.SharedInstance, shared.InstanceID)
	require.EqualValues(t, 4, shared.Lag)
	require.EqualValues(t, 6, shared.EventsProcessed)
	cs, _ := logOrder(t, b)
	require.Equal(t, cs[5], shared.Cursor, "the cursor is the sixth event's")
	require.Equal(t, []string{"test:event:noted"}, shared.EventTypes)
	require.Less(t, shared.HeartbeatAge, time.Minute)
	require.Zero(t, shared.Attempts)
	require.Nil(t, shared.FailedPosition)
}

func TestStatusShowsFailureAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 2}, poisonAt(1))
	})
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 3, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)

	st := status(t, b, "test:broken", "") // "" is the shared instance
	require.Equal(t, dispatcher.StateDead, st.Status)
	require.Equal(t, 2, st.Attempts)
	require.NotNil(t, st.FailedPosition)
	require.Equal(t, positionOf(t, b, 1), *st.FailedPosition)
	require.Contains(t, st.LastError, "poison pill")
	require.NotNil(t, st.DeadSince)
	require.EqualValues(t, 1, st.EventsProcessed)
	require.EqualValues(t, 2, st.Lag)
	require.Empty(t, st.DeadLetters)

	_, err := dispatcher.Skip(context.Background(), b.db.Pool, "test:broken", "")
	require.NoError(t, err)
	st = status(t, b, "test:broken", "")
	require.Len(t, st.DeadLetters, 1)
	require.Equal(t, positionOf(t, b, 1), st.DeadLetters[0].Position)
	require.Equal(t, "test:event:noted", st.DeadLetters[0].EventType)
	require.Equal(t, "t1", st.DeadLetters[0].TenantID)
}

func TestStatusOfUnknownConsumerIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "a", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
	})
	_ = opsDispatcher(t, b, "pod-1")
	_, err := dispatcher.Status(context.Background(), b.db.Pool, "test:nope", "")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	require.EqualError(t, err, "consumer test:nope not found")
	// A per-instance consumer has no shared row.
	_, err = dispatcher.Status(context.Background(), b.db.Pool, "test:a", "")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	for _, verb := range []func() error{
		func() error { return dispatcher.Restart(context.Background(), b.db.Pool, "test:a", "pod-2") },
		func() error { return dispatcher.Disable(context.Background(), b.db.Pool, "test:a", "pod-2") },
		func() error { return dispatcher.Enable(context.Background(), b.db.Pool, "test:a", "pod-2") },
		func() error {
			_, err := dispatcher.Skip(context.Background(), b.db.Pool, "test:a", "pod-2")
			return err
		},
		func() error {
			_, err := dispatcher.Rewind(context.Background(), b.db.Pool, "test:a", "pod-2", dispatcher.RewindTo{})
			return err
		},
	} {
		err := verb()
		require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
		require.EqualError(t, err, "consumer test:a (instance pod-2) not found; its instances: pod-1")
	}
}

func TestRestartRetriesThePoisonEvent(t *testing.T) {
	t.Parallel()
	poison := poisonAt(2)
	b := setup(t, func(b *bundle) {
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 2}, poison)
	})
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 5, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)
	before := status(t, b, "test:broken", "")

	require.NoError(t, dispatcher.Restart(context.Background(), b.db.Pool, "test:broken", ""))
	st := status(t, b, "test:broken", "")
	require.Equal(t, dispatcher.StateIdle, st.Status)
	require.Equal(t, before.Cursor, st.Cursor, "restart keeps the cursor")
	require.Zero(t, st.Attempts)
	require.Nil(t, st.DeadSince)

	// Still failing: the same event is retried and counts a fresh attempt.
	n, err := d.RunOnce(context.Background(), "test:broken")
	require.NoError(t, err)
	require.Zero(t, n)
	st = status(t, b, "test:broken", "")
	require.Equal(t, 1, st.Attempts)
	require.Equal(t, positionOf(t, b, 2), *st.FailedPosition)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)

	// Fixed: restart delivers the poison event and everything after it.
	poison.Store(-1)
	require.NoError(t, dispatcher.Restart(context.Background(), b.db.Pool, "test:broken", ""))
	drain(t, d, "test:broken", 3)
	require.Equal(t, []int{0, 1, 2, 3, 4}, seenNs(t, b, "broken"))
	st = status(t, b, "test:broken", "")
	require.Equal(t, dispatcher.StateIdle, st.Status)
	require.Zero(t, st.Lag)
	require.Nil(t, st.FailedPosition)
}

func TestRestartRefusesNonDead(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	_ = opsDispatcher(t, b, "pod-1")
	err := dispatcher.Restart(context.Background(), b.db.Pool, "test:a", "")
	requireRefused(t, err, "restart", dispatcher.StateIdle, "dead")
	require.EqualError(t, err, "consumer test:a is idle; restart needs dead")

	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:a", ""))
	err = dispatcher.Restart(context.Background(), b.db.Pool, "test:a", "")
	requireRefused(t, err, "restart", dispatcher.StateDisabled, "dead")
	require.Equal(t, dispatcher.StateDisabled, status(t, b, "test:a", "").Status, "a refusal changes nothing")
}

func TestSkipMovesPastThePoisonEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 2}, poisonAt(2))
	})
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 5, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)

	dl, err := dispatcher.Skip(context.Background(), b.db.Pool, "test:broken", "")
	require.NoError(t, err)
	require.Equal(t, positionOf(t, b, 2), dl.Position)
	require.Equal(t, "test:event:noted", dl.EventType)
	require.True(t, strings.HasPrefix(dl.Error, "skipped by operator: "), dl.Error)
	require.True(t, strings.HasSuffix(dl.Error, "poison pill"), dl.Error)
	st := status(t, b, "test:broken", "")
	require.Equal(t, dispatcher.StateIdle, st.Status)
	cs, _ := logOrder(t, b)
	require.Equal(t, cs[2], st.Cursor, "the cursor sits on the skipped event")
	require.Zero(t, st.Attempts)
	require.Nil(t, st.FailedPosition)
	require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = 'test:broken' AND position = $1 AND error LIKE 'skipped by operator%'`, dl.Position))

	// The events after it are delivered; the poison event never commits.
	drain(t, d, "test:broken", 2)
	require.Equal(t, []int{0, 1, 3, 4}, seenNs(t, b, "broken"))
}

// Without a recorded failure, skip moves past the next event of the
// consumer's types, whatever its state; a disabled consumer stays disabled.
func TestSkipWithoutFailureSkipsTheNextEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 3, 1)
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:a", ""))
	var dl dispatcher.DeadLetter
	deadline := time.Now().Add(20 * time.Second)
	for { // the events become visible once the horizon passes them
		var err error
		dl, err = dispatcher.Skip(context.Background(), b.db.Pool, "test:a", "")
		if err == nil {
			break
		}
		require.ErrorIs(t, err, dispatcher.ErrNothingToSkip)
		require.True(t, time.Now().Before(deadline))
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, positionOf(t, b, 0), dl.Position)
	require.Equal(t, "skipped by operator", dl.Error)
	require.Equal(t, dispatcher.StateDisabled, status(t, b, "test:a", "").Status)
	require.NoError(t, dispatcher.Enable(context.Background(), b.db.Pool, "test:a", ""))
	drain(t, d, "test:a", 2)
	require.Equal(t, []int{1, 2}, seenNs(t, b, "a"))
}

func TestSkipRefusesWhenNothingToSkip(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d := opsDispatcher(t, b, "pod-1")
	_, err := dispatcher.Skip(context.Background(), b.db.Pool, "test:a", "")
	require.ErrorIs(t, err, dispatcher.ErrNothingToSkip)
	require.Contains(t, err.Error(), "consumer test:a has no failing event and no event after its cursor")

	b.write(t, "t1", 0, 2, 1)
	drain(t, d, "test:a", 2)
	before := status(t, b, "test:a", "")
	_, err = dispatcher.Skip(context.Background(), b.db.Pool, "test:a", "")
	require.ErrorIs(t, err, dispatcher.ErrNothingToSkip)
	require.Equal(t, before.Cursor, status(t, b, "test:a", "").Cursor)
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters`), "a refusal writes no dead letter")
}

func TestDisableStopsDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 2, 1)
	drain(t, d, "test:a", 2)
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:a", ""))
	b.write(t, "t1", 2, 3, 1)
	// Wait until the new events are visible (skip's probe sees them), then
	// show that passes still deliver nothing.
	b.db.WaitVisible(t)
	for range 3 {
		n, err := d.RunOnce(context.Background(), "test:a")
		require.NoError(t, err)
		require.Zero(t, n)
	}
	st := status(t, b, "test:a", "")
	require.Equal(t, dispatcher.StateDisabled, st.Status)
	require.EqualValues(t, 3, st.Lag)
	require.Len(t, seenNs(t, b, "a"), 2)
}

func TestDisableParksADeadConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 1}, poisonAt(0))
	})
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 1, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:broken", ""))
	require.Equal(t, dispatcher.StateDisabled, status(t, b, "test:broken", "").Status)
}

// Status claims no death and no retry that is not there: a dead consumer
// retries nothing until an operator or the revival acts (the backoff of
// its last failure is no next attempt), and a consumer disabled while dead
// is disabled, not dead since then. Its failure record stays.
func TestStatusOfAParkedConsumerShowsNoDeathOrRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 1}, poisonAt(0))
	})
	d := newDispatcher(t, b, &dispatcher.Config{InstanceID: "pod-1", RetryBaseDelay: time.Hour, RetryMaxDelay: time.Hour})
	b.write(t, "t1", 0, 1, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)
	st := status(t, b, "test:broken", "")
	require.NotNil(t, st.DeadSince)
	require.Nil(t, st.NextAttemptAt, "a dead consumer has no next attempt")

	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:broken", ""))
	st = status(t, b, "test:broken", "")
	require.Equal(t, dispatcher.StateDisabled, st.Status)
	require.Nil(t, st.DeadSince, "disabled, not dead")
	require.Nil(t, st.NextAttemptAt, "a disabled consumer has no next attempt")
	require.Equal(t, 1, st.Attempts)
	require.NotNil(t, st.FailedPosition)
	require.Contains(t, st.LastError, "poison pill")
}

func TestDisableRefusesDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	_ = opsDispatcher(t, b, "pod-1")
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:a", ""))
	err := dispatcher.Disable(context.Background(), b.db.Pool, "test:a", "")
	requireRefused(t, err, "disable", dispatcher.StateDisabled, "idle or dead")
	require.EqualError(t, err, "consumer test:a is disabled; disable needs idle or dead")
}

func TestEnableResumesDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d := opsDispatcher(t, b, "pod-1")
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:a", ""))
	b.write(t, "t1", 0, 4, 2)
	require.NoError(t, dispatcher.Enable(context.Background(), b.db.Pool, "test:a", ""))
	require.Equal(t, dispatcher.StateIdle, status(t, b, "test:a", "").Status)
	drain(t, d, "test:a", 4)
	require.Equal(t, []int{0, 1, 2, 3}, seenNs(t, b, "a"))
}

func TestEnableRefusesNonDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "a", nil)
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 1}, poisonAt(0))
	})
	d := opsDispatcher(t, b, "pod-1")
	err := dispatcher.Enable(context.Background(), b.db.Pool, "test:a", "")
	requireRefused(t, err, "enable", dispatcher.StateIdle, "disabled")
	require.EqualError(t, err, "consumer test:a is idle; enable needs disabled")

	b.write(t, "t1", 0, 1, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)
	err = dispatcher.Enable(context.Background(), b.db.Pool, "test:broken", "")
	requireRefused(t, err, "enable", dispatcher.StateDead, "disabled")
	require.Equal(t, dispatcher.StateDead, status(t, b, "test:broken", "").Status, "enable is no restart")
}

// counter registers a projection that counts applications per event.
func counter(b *bundle, name string) {
	p := framework.MultiStreamProjection(b.f, name, &framework.ProjectionOptions{BatchSize: 4})
	framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, $2, $3, $4, '', '')`, tx.TenantID(), name, e.ID, e.Payload.N)
		return err
	})
}

// applications returns how often each event N was applied.
func applications(t *testing.T, b *bundle, consumer string) map[int]int {
	t.Helper()
	out := map[int]int{}
	for _, n := range seenNs(t, b, consumer) {
		out[n]++
	}
	return out
}

func TestRewindToPositionRedeliversFromThatEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { counter(b, "c") })
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 10, 3)
	drain(t, d, "test:c", 10)
	cs, ns := logOrder(t, b)
	head := status(t, b, "test:c", "").Cursor
	require.Equal(t, cs[9], head)

	// Replay from the 7th event in delivery order on.
	res, err := dispatcher.Rewind(context.Background(), b.db.Pool, "test:c", "", dispatcher.RewindTo{Position: cs[6].Position})
	require.NoError(t, err)
	require.Equal(t, head, res.From)
	require.Equal(t, eventstore.Cursor{CommitKey: cs[6].CommitKey, Position: cs[6].Position - 1}, res.To)
	st := status(t, b, "test:c", "")
	require.Equal(t, res.To, st.Cursor)
	require.EqualValues(t, 4, st.Lag)
	drain(t, d, "test:c", 4)
	apps := applications(t, b, "c")
	for i, n := range ns {
		want := 1
		if i >= 6 {
			want = 2
		}
		require.Equal(t, want, apps[n], "event %d (#%d in order)", n, i)
	}

	// Position 0 replays the whole log.
	res, err = dispatcher.Rewind(context.Background(), b.db.Pool, "test:c", "", dispatcher.RewindTo{})
	require.NoError(t, err)
	require.Equal(t, eventstore.Cursor{}, res.To)
	drain(t, d, "test:c", 10)
	require.Len(t, seenNs(t, b, "c"), 24)
}

func TestRewindToTimeRedeliversEventsCreatedSince(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { counter(b, "c") })
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 4, 2)
	var since time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&since))
	b.write(t, "t1", 4, 3, 2)
	drain(t, d, "test:c", 7)

	_, err := dispatcher.Rewind(context.Background(), b.db.Pool, "test:c", "", dispatcher.RewindTo{Time: since})
	require.NoError(t, err)
	drain(t, d, "test:c", 3)
	apps := applications(t, b, "c")
	require.Equal(t, map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 2, 5: 2, 6: 2}, apps)
}

func TestRewindRevivesADeadConsumer(t *testing.T) {
	t.Parallel()
	poison := poisonAt(3)
	b := setup(t, func(b *bundle) {
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 1}, poison)
	})
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 5, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)
	poison.Store(-1)
	_, err := dispatcher.Rewind(context.Background(), b.db.Pool, "test:broken", "", dispatcher.RewindTo{Position: positionOf(t, b, 1)})
	require.NoError(t, err)
	st := status(t, b, "test:broken", "")
	require.Equal(t, dispatcher.StateIdle, st.Status)
	require.Zero(t, st.Attempts)
	require.Empty(t, st.LastError)
	drain(t, d, "test:broken", 4)
	require.Equal(t, []int{0, 1, 2, 1, 2, 3, 4}, seenNs(t, b, "broken"))
}

// A consumer at the start rewound to the first event stays where it is:
// no event lies between, so the target is not "forward".
func TestRewindAtTheStartToTheFirstEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { counter(b, "c") })
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 3, 1)
	res, err := dispatcher.Rewind(context.Background(), b.db.Pool, "test:c", "", dispatcher.RewindTo{Position: positionOf(t, b, 0)})
	require.NoError(t, err)
	require.Equal(t, eventstore.Cursor{}, res.From)
	require.Equal(t, eventstore.Cursor{}, res.To)
	_, err = dispatcher.Rewind(context.Background(), b.db.Pool, "test:c", "", dispatcher.RewindTo{Time: time.Unix(0, 0)})
	require.NoError(t, err)
	drain(t, d, "test:c", 3)
	require.Equal(t, []int{0, 1, 2}, seenNs(t, b, "c"))
}

func TestRewindRefusesForwardAndUnknownTargets(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { counter(b, "c") })
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 6, 1)
	drain(t, d, "test:c", 6)
	ctx := context.Background()
	_, err := dispatcher.Rewind(ctx, b.db.Pool, "test:c", "", dispatcher.RewindTo{Position: positionOf(t, b, 2)})
	require.NoError(t, err)
	before := status(t, b, "test:c", "")

	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:c", "", dispatcher.RewindTo{Position: positionOf(t, b, 4)})
	require.ErrorIs(t, err, dispatcher.ErrRewindForward)
	require.Contains(t, err.Error(), "rewind only moves back")

	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:c", "", dispatcher.RewindTo{Position: 999999})
	require.ErrorIs(t, err, dispatcher.ErrEventNotFound)
	require.EqualError(t, err, "no event has position 999999")

	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:c", "", dispatcher.RewindTo{Time: time.Now().Add(time.Hour)})
	require.ErrorIs(t, err, dispatcher.ErrEventNotFound)

	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:c", "", dispatcher.RewindTo{Position: 1, Time: time.Now()})
	require.Error(t, err)
	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:c", "", dispatcher.RewindTo{Position: -1})
	require.Error(t, err)

	require.Equal(t, before.Cursor, status(t, b, "test:c", "").Cursor, "refusals change nothing")
}

// Per-instance consumers have one row per process; the verbs act on the
// row of the instance they are given.
func TestVerbsActOnTheGivenInstanceRow(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
	})
	pod1 := opsDispatcher(t, b, "pod-1")
	pod2 := opsDispatcher(t, b, "pod-2")
	ctx := context.Background()
	require.NoError(t, dispatcher.Disable(ctx, b.db.Pool, "test:local", "pod-1"))
	b.write(t, "t1", 0, 3, 1)
	drain(t, pod2, "test:local", 3)
	n, err := pod1.RunOnce(ctx, "test:local")
	require.NoError(t, err)
	require.Zero(t, n, "pod-1's row is disabled")
	require.Equal(t, dispatcher.StateDisabled, status(t, b, "test:local", "pod-1").Status)
	require.Equal(t, dispatcher.StateIdle, status(t, b, "test:local", "pod-2").Status)

	err = dispatcher.Enable(ctx, b.db.Pool, "test:local", "pod-2")
	requireRefused(t, err, "enable", dispatcher.StateIdle, "disabled")
	require.EqualError(t, err, "consumer test:local (instance pod-2) is idle; enable needs disabled")
	require.NoError(t, dispatcher.Enable(ctx, b.db.Pool, "test:local", "pod-1"))
	drain(t, pod1, "test:local", 3)

	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:local", "pod-2", dispatcher.RewindTo{})
	require.NoError(t, err)
	require.Equal(t, eventstore.Cursor{}, status(t, b, "test:local", "pod-2").Cursor)
	require.NotEqual(t, eventstore.Cursor{}, status(t, b, "test:local", "pod-1").Cursor)
}

// An ops verb waits for a running pass (it takes the pass's lock) and then
// acts on the state the pass committed, so the pass cannot overwrite it;
// meanwhile the consumer shows as processing.
func TestRewindWaitsForARunningPass(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	release := make(chan struct{})
	b := setup(t, func(b *bundle) {
		p := framework.MultiStreamProjection(b.f, "slow", nil)
		framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if e.Payload.N == 1 {
				close(entered)
				<-release
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'slow', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
	})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // on failure, before the pool closes
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 3, 1)
	b.db.WaitVisible(t)

	ctx := context.Background()
	passDone := make(chan error, 1)
	go func() {
		n, err := d.RunOnce(ctx, "test:slow")
		if err == nil && n != 3 {
			err = errors.New("the pass did not deliver all three events")
		}
		passDone <- err
	}()
	select {
	case <-entered:
	case err := <-passDone:
		t.Fatalf("the pass ended before it reached event 1: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the pass never reached event 1")
	}
	require.Equal(t, dispatcher.StateProcessing, status(t, b, "test:slow", "").Status)

	type result struct {
		res dispatcher.RewindResult
		err error
	}
	rewound := make(chan result, 1)
	go func() {
		res, err := dispatcher.Rewind(ctx, b.db.Pool, "test:slow", "", dispatcher.RewindTo{})
		rewound <- result{res, err}
	}()
	// The rewind waits on the consumer's advisory lock.
	waitCount(t, b, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`, 1, 10*time.Second)
	select {
	case r := <-rewound:
		t.Fatalf("rewind returned while the pass held the lock: %+v", r)
	default:
	}
	unblock()
	require.NoError(t, <-passDone)
	r := <-rewound
	require.NoError(t, r.err)
	cs, _ := logOrder(t, b)
	require.Equal(t, cs[2], r.res.From, "the rewind saw the pass's cursor")
	st := status(t, b, "test:slow", "")
	require.Equal(t, eventstore.Cursor{}, st.Cursor, "the pass did not overwrite the rewind")
	require.Equal(t, dispatcher.StateIdle, st.Status)
}

// Passes run in a loop while disable, enable and rewind race them. Every
// rewind that moved the cursor shows as exactly one restart of the
// application log, each pass continues exactly where the previous one (or
// a rewind) left the cursor, and the effects match events_processed.
func TestVerbsRacingPassesKeepTheCursorConsistent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { counter(b, "c") })
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 40, 5)
	b.db.WaitVisible(t)

	ctx, stop := context.WithCancel(context.Background())
	var passErr atomic.Value
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			if _, err := d.RunOnce(context.Background(), "test:c"); err != nil {
				passErr.Store(err)
				return
			}
		}
	})
	effective := 0
	for i := range 60 {
		require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:c", ""))
		if i%4 == 0 {
			res, err := dispatcher.Rewind(context.Background(), b.db.Pool, "test:c", "", dispatcher.RewindTo{})
			require.NoError(t, err)
			if res.From != (eventstore.Cursor{}) {
				effective++
			}
		}
		require.NoError(t, dispatcher.Enable(context.Background(), b.db.Pool, "test:c", ""))
		time.Sleep(time.Duration(i%3) * time.Millisecond)
	}
	stop()
	wg.Wait()
	require.Nil(t, passErr.Load())
	// Let the consumer catch up.
	deadline := time.Now().Add(20 * time.Second)
	for status(t, b, "test:c", "").Lag > 0 {
		require.True(t, time.Now().Before(deadline))
		_, err := d.RunOnce(context.Background(), "test:c")
		require.NoError(t, err)
	}

	_, ns := logOrder(t, b)
	idx := map[int]int{}
	for i, n := range ns {
		idx[n] = i
	}
	applied := seenNs(t, b, "c")
	restarts := 0
	for i, n := range applied {
		switch {
		case i == 0:
			require.Zero(t, idx[n])
		case idx[n] == 0:
			restarts++
		default:
			require.Equal(t, idx[applied[i-1]]+1, idx[n], "application %d continues where the cursor was", i)
		}
	}
	require.Positive(t, effective)
	require.Equal(t, effective, restarts, "every effective rewind restarted delivery exactly once")
	st := status(t, b, "test:c", "")
	require.EqualValues(t, len(applied), st.EventsProcessed)
	require.Equal(t, dispatcher.StateIdle, st.Status)
	cs, _ := logOrder(t, b)
	require.Equal(t, cs[len(cs)-1], st.Cursor)
}

func TestRemoveInstanceDeletesASilentInstancesRows(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
		recorder(b, "shared", nil)
	})
	_ = opsDispatcher(t, b, "pod-1")
	_ = opsDispatcher(t, b, "pod-2")
	ctx := context.Background()

	_, err := dispatcher.RemoveInstance(ctx, b.db.Pool, "pod-1")
	require.ErrorIs(t, err, dispatcher.ErrInstanceAlive)
	_, err = dispatcher.RemoveInstance(ctx, b.db.Pool, "pod-9")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	_, err = dispatcher.RemoveInstance(ctx, b.db.Pool, dispatcher.SharedInstance)
	require.ErrorIs(t, err, dispatcher.ErrSharedInstance)
	require.EqualError(t, err, "the shared instance __shared__ cannot be removed")
	_, err = dispatcher.RemoveInstance(ctx, b.db.Pool, "")
	require.ErrorIs(t, err, dispatcher.ErrSharedInstance)

	_, err = b.db.Pool.Exec(ctx, `UPDATE event_consumers SET heartbeat_at = now() - interval '2 minutes' WHERE instance_id = 'pod-1'`)
	require.NoError(t, err)
	n, err := dispatcher.RemoveInstance(ctx, b.db.Pool, "pod-1")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	list, err := dispatcher.List(ctx, b.db.Pool)
	require.NoError(t, err)
	var rows []string
	for _, s := range list {
		rows = append(rows, s.Name+"/"+s.InstanceID)
	}
	require.Equal(t, []string{"test:local/pod-2", "test:shared/__shared__"}, rows)
}

// The SSE consumer (dispatcher.SSEConsumerName) feeds its process's live
// streams: a skip passes an event by for its live clients, so it is allowed
// only past an event the consumer fails at, where it may be the only way
// on; a disable, which would leave the streams open without events, never.
// A row disabled before (an older release allowed it) can be enabled.
func TestVerbsOnTheSSEConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	var poison atomic.Int64
	poison.Store(-1)
	d, err := dispatcher.New(b.db.Pool, b.reg, []dispatcher.Consumer{{
		Name: dispatcher.SSEConsumerName, Delivery: framework.DeliveryPerInstance, System: true, MaxAttempts: 2,
		Apply: func(_ context.Context, _ *framework.Tx, env framework.Envelope) error {
			var p noted
			if err := json.Unmarshal(env.Payload, &p); err != nil {
				return err
			}
			if int64(p.N) == poison.Load() {
				return errors.New("cannot publish")
			}
			return nil
		},
	}}, &dispatcher.Config{InstanceID: "api-1", RetryBaseDelay: time.Millisecond, RetryMaxDelay: 2 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Register(ctx))
	b.write(t, "t1", 0, 2, 1)
	drain(t, d, dispatcher.SSEConsumerName, 2)

	// Healthy: nothing to skip, nothing to disable.
	b.write(t, "t1", 2, 1, 1)
	b.db.WaitVisible(t)
	_, err = dispatcher.Skip(ctx, b.db.Pool, dispatcher.SSEConsumerName, "api-1")
	require.ErrorIs(t, err, dispatcher.ErrLiveStreamConsumer)
	require.Contains(t, err.Error(), "consumer system:consumer:sse-broadcast (instance api-1) feeds the live SSE streams of its process and is not failing at an event")
	err = dispatcher.Disable(ctx, b.db.Pool, dispatcher.SSEConsumerName, "api-1")
	require.ErrorIs(t, err, dispatcher.ErrLiveStreamConsumer)
	require.Contains(t, err.Error(), "drain or stop that process")
	drain(t, d, dispatcher.SSEConsumerName, 1)

	// Failing at an event: skip moves past it, and only it.
	poison.Store(4)
	b.write(t, "t1", 3, 3, 1)
	untilDead(t, b, d, dispatcher.SSEConsumerName, "api-1")
	err = dispatcher.Disable(ctx, b.db.Pool, dispatcher.SSEConsumerName, "api-1")
	require.ErrorIs(t, err, dispatcher.ErrLiveStreamConsumer, "dead too: restart or skip, not disable")
	dl, err := dispatcher.Skip(ctx, b.db.Pool, dispatcher.SSEConsumerName, "api-1")
	require.NoError(t, err)
	require.Equal(t, positionOf(t, b, 4), dl.Position)
	require.Contains(t, dl.Error, "cannot publish")
	drain(t, d, dispatcher.SSEConsumerName, 1)
	_, err = dispatcher.Skip(ctx, b.db.Pool, dispatcher.SSEConsumerName, "api-1")
	require.ErrorIs(t, err, dispatcher.ErrLiveStreamConsumer, "healthy again")

	// A row an older release disabled is enabled as before.
	_, err = b.db.Pool.Exec(ctx, `UPDATE event_consumers SET status = 'disabled' WHERE name = $1`, dispatcher.SSEConsumerName)
	require.NoError(t, err)
	require.NoError(t, dispatcher.Enable(ctx, b.db.Pool, dispatcher.SSEConsumerName, "api-1"))
	require.Equal(t, dispatcher.StateIdle, status(t, b, dispatcher.SSEConsumerName, "api-1").Status)
}
