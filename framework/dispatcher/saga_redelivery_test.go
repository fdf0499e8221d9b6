package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestSagaEffectsOnceUnderRedelivery: a saga appends one event per
// triggering event, to a stream of its own with NoStream. Event 2's handler
// fails once after its append (the pass is re-run up to event 1, then
// event 2 is retried), and event 4's append conflicts with a stream that
// already exists (a failure the saga does not see until its append is
// written). Every other event's effect exists exactly once; event 4 is the
// one recorded as failed (not an event after it) and nothing of it was
// appended; skipped by the operator, its dead letter names it, and the
// saga goes on.
func TestSagaEffectsOnceUnderRedelivery(t *testing.T) {
	t.Parallel()
	var flaky atomic.Bool
	flaky.Store(true)
	var der framework.EventType[derived]
	b := setup(t, func(b *bundle) {
		der = framework.DefineEvent[derived](b.f, "derived", nil)
		saga := framework.MultiStreamProjection(b.f, "saga", &framework.ProjectionOptions{Saga: true, MaxAttempts: 2})
		framework.On(saga, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if err := tx.Append(framework.Stream{Type: "d", ID: fmt.Sprint(e.Payload.N)}, framework.NoStream, der.With(derived{N: e.Payload.N})); err != nil {
				return err
			}
			if e.Payload.N == 2 && flaky.CompareAndSwap(true, false) {
				return errors.New("flaky once")
			}
			return nil
		})
	})
	// Stream d/4 exists already: event 4's append must conflict.
	_, err := b.rt.InTx(context.Background(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		return tx.Append(framework.Stream{Type: "d", ID: "4"}, framework.NoStream, der.With(derived{N: -4}))
	})
	require.NoError(t, err)
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, RetryMaxDelay: 5 * time.Millisecond})
	b.write(t, "t1", 0, 7, 1)
	b.db.WaitVisible(t)
	deadline := time.Now().Add(10 * time.Second)
	for state(t, b, "test:saga", dispatcher.SharedInstance).status != "dead" {
		require.True(t, time.Now().Before(deadline), "the saga never died on event 4")
		_, err := d.RunOnce(context.Background(), "test:saga")
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	derivedN := func() []int64 {
		return positions(t, b, `SELECT (payload->>'n')::bigint FROM events WHERE type = 'test:event:derived' AND (payload->>'n')::int >= 0 ORDER BY 1`)
	}
	require.Equal(t, []int64{0, 1, 2, 3}, derivedN(), "each effect once, event 2's too; none of event 4")
	noted4 := positions(t, b, `SELECT position FROM events WHERE type = 'test:event:noted' AND (payload->>'n')::int = 4`)
	require.Equal(t, noted4, positions(t, b, `SELECT failed_position FROM event_consumers WHERE name = 'test:saga'`),
		"the failure is recorded against the event whose append conflicted")

	_, err = dispatcher.Skip(context.Background(), b.db.Pool, "test:saga", dispatcher.SharedInstance)
	require.NoError(t, err)
	drain(t, d, "test:saga", 2)
	require.Equal(t, []int64{0, 1, 2, 3, 5, 6}, derivedN())
	require.Equal(t, noted4, positions(t, b, `SELECT position FROM event_dead_letters WHERE consumer = 'test:saga'`))
}
