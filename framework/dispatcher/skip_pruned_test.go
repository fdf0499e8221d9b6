package dispatcher_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestSkipWhenTheFailingEventWasPruned: a dead consumer is disabled (what
// the prune's refusal suggests) and the prune then deletes its failing
// event. A skip must not move past the next event instead, an innocent one
// that never failed, recording it as a dead letter under the pruned
// event's error: it refuses, and the consumer goes on once enabled.
func TestSkipWhenTheFailingEventWasPruned(t *testing.T) {
	t.Parallel()
	poison := poisonAt(2)
	b := setup(t, func(b *bundle) {
		flaky(b, "broken", &framework.ProjectionOptions{MaxAttempts: 2}, poison)
	})
	ctx := context.Background()
	d := opsDispatcher(t, b, "pod-1")
	b.write(t, "t1", 0, 5, 1)
	untilDead(t, b, d, "test:broken", dispatcher.SharedInstance)
	require.NoError(t, dispatcher.Disable(ctx, b.db.Pool, "test:broken", ""))
	before := status(t, b, "test:broken", "")
	require.NotNil(t, before.FailedPosition)
	// What `kumiko events prune --types test:event:noted` deletes.
	_, err := b.db.Pool.Exec(ctx, `DELETE FROM events WHERE position = $1`, *before.FailedPosition)
	require.NoError(t, err)

	_, err = dispatcher.Skip(ctx, b.db.Pool, "test:broken", "")
	require.ErrorIs(t, err, dispatcher.ErrNothingToSkip)
	require.ErrorContains(t, err, "is gone")
	after := status(t, b, "test:broken", "")
	require.Equal(t, before.Cursor, after.Cursor, "the cursor stays")
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters`), "no innocent event is dead-lettered")

	poison.Store(-1)
	require.NoError(t, dispatcher.Enable(ctx, b.db.Pool, "test:broken", ""))
	drain(t, d, "test:broken", 2)
	require.Equal(t, []int{0, 1, 3, 4}, seenNs(t, b, "broken"))
}
