package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// release registers the projection test:p of one release of the code on
// the bundle's database: it records the events of the given types (noted,
// other) in seen and fails on the one whose N is poison. Its dispatcher
// registers the consumer, which stores the release's event types.
func release(t *testing.T, b *bundle, types []string, poison int) *dispatcher.Dispatcher {
	t.Helper()
	reg := framework.NewRegistry()
	f := reg.Feature("test")
	evs := map[string]framework.EventType[noted]{
		"noted": framework.DefineEvent[noted](f, "noted", nil),
		"other": framework.DefineEvent[noted](f, "other", nil),
	}
	p := framework.MultiStreamProjection(f, "p", &framework.ProjectionOptions{MaxAttempts: 2})
	for _, typ := range types {
		framework.On(p, evs[typ], func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if e.Payload.N == poison {
				return errors.New("poison pill")
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'p', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
	}
	d, err := dispatcher.New(b.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil),
		&dispatcher.Config{InstanceID: "pod-1", RetryBaseDelay: time.Millisecond, RetryMaxDelay: 2 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	return d
}

// writeTyped appends one event of the given type per n, in this order.
func writeTyped(t *testing.T, b *bundle, other framework.EventType[noted], typ string, ns ...int) {
	t.Helper()
	for _, n := range ns {
		ev := b.noted.With(noted{N: n})
		if typ == "other" {
			ev = other.With(noted{N: n})
		}
		_, err := b.rt.InTx(context.Background(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: fmt.Sprint(n)}, framework.AnyVersion, ev)
		})
		require.NoError(t, err)
	}
}

// untilDeadAt runs passes of test:p until it is dead on the event with n.
func untilDeadAt(t *testing.T, b *bundle, d *dispatcher.Dispatcher, n int) {
	t.Helper()
	b.db.WaitVisible(t)
	untilDead(t, b, d, "test:p", dispatcher.SharedInstance)
	st := status(t, b, "test:p", "")
	require.NotNil(t, st.FailedPosition)
	require.Equal(t, positionOf(t, b, n), *st.FailedPosition)
}

// TestSkipAfterTheConsumerTookMoreTypes: a consumer died on an event, and
// a new release consumes more types. Events of the new types between its
// cursor and the failing event have not been delivered to it: a skip that
// moved the cursor past the failing event would pass them by undelivered
// and without a dead letter, a silent gap. The skip refuses and changes
// nothing; after a restart they are delivered, and when the failing
// event fails again, a skip moves past it alone.
func TestSkipAfterTheConsumerTookMoreTypes(t *testing.T) {
	t.Parallel()
	var other framework.EventType[noted]
	b := setup(t, func(b *bundle) { other = framework.DefineEvent[noted](b.f, "other", nil) })
	ctx := context.Background()
	writeTyped(t, b, other, "noted", 0, 1)
	writeTyped(t, b, other, "other", 10, 11)
	writeTyped(t, b, other, "noted", 2, 3)

	old := release(t, b, []string{"noted"}, 2)
	untilDeadAt(t, b, old, 2)
	require.Equal(t, []int{0, 1}, seenNs(t, b, "p"))

	d := release(t, b, []string{"noted", "other"}, 2)
	before := status(t, b, "test:p", "")
	_, err := dispatcher.Skip(ctx, b.db.Pool, "test:p", "")
	require.ErrorIs(t, err, dispatcher.ErrNothingToSkip)
	require.ErrorContains(t, err, "restart")
	after := status(t, b, "test:p", "")
	require.Equal(t, before.Cursor, after.Cursor, "a refused skip moves nothing")
	require.Equal(t, dispatcher.StateDead, after.Status)
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters`))

	require.NoError(t, dispatcher.Restart(ctx, b.db.Pool, "test:p", ""))
	untilDeadAt(t, b, d, 2)
	require.Equal(t, []int{0, 1, 10, 11}, seenNs(t, b, "p"), "the events of the new type are delivered")
	dl, err := dispatcher.Skip(ctx, b.db.Pool, "test:p", "")
	require.NoError(t, err)
	require.Equal(t, positionOf(t, b, 2), dl.Position)
	drain(t, d, "test:p", 1)
	require.Equal(t, []int{0, 1, 10, 11, 3}, seenNs(t, b, "p"))
}

// TestSkipAfterTheConsumerDroppedTheFailingType: a consumer died on an
// event of a type that a new release no longer consumes. That event is no
// longer the consumer's to skip: a skip refuses rather than dead-letter
// it, and a restart goes on with the events of the types it consumes.
func TestSkipAfterTheConsumerDroppedTheFailingType(t *testing.T) {
	t.Parallel()
	var other framework.EventType[noted]
	b := setup(t, func(b *bundle) { other = framework.DefineEvent[noted](b.f, "other", nil) })
	ctx := context.Background()
	writeTyped(t, b, other, "noted", 0, 1)
	writeTyped(t, b, other, "other", 10, 11)
	writeTyped(t, b, other, "noted", 2, 3)

	old := release(t, b, []string{"noted", "other"}, 10)
	untilDeadAt(t, b, old, 10)

	d := release(t, b, []string{"noted"}, 10)
	before := status(t, b, "test:p", "")
	_, err := dispatcher.Skip(ctx, b.db.Pool, "test:p", "")
	require.ErrorIs(t, err, dispatcher.ErrNothingToSkip)
	require.ErrorContains(t, err, "no longer consumes")
	require.Equal(t, before.Cursor, status(t, b, "test:p", "").Cursor)
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters`))

	require.NoError(t, dispatcher.Restart(ctx, b.db.Pool, "test:p", ""))
	drain(t, d, "test:p", 2)
	require.Equal(t, []int{0, 1, 2, 3}, seenNs(t, b, "p"))
	st := status(t, b, "test:p", "")
	require.Equal(t, dispatcher.StateIdle, st.Status)
	require.Nil(t, st.FailedPosition)
}
