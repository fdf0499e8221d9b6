package idempotency

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tryAdd queues up to its limit and refuses beyond it (FinishAsync then
// stores in the caller); the refused item is not queued, the others run.
func TestTryAddRefusesBeyondTheLimit(t *testing.T) {
	t.Parallel()
	ran := make(chan []int, 1)
	b := batcher[int]{take: func(q []int) int { return len(q) }, run: func(batch []int) { ran <- batch }}
	release := b.hold()
	for i := range 3 {
		require.True(t, b.tryAdd(i, 3))
	}
	require.False(t, b.tryAdd(3, 3))
	release()
	require.Equal(t, []int{0, 1, 2}, <-ran)
	require.True(t, b.tryAdd(4, 3), "the queue has room again")
	require.Equal(t, []int{4}, <-ran)
}

// An item waits for delay unless a caller takes it first; takeBatch takes
// at most what take allows and nothing while the batcher is held.
func TestBatcherWaitsForARide(t *testing.T) {
	t.Parallel()
	ran := make(chan []int, 2)
	b := batcher[int]{take: func(q []int) int { return min(len(q), 2) }, run: func(batch []int) { ran <- batch }, delay: 50 * time.Millisecond}
	for i := range 3 {
		require.True(t, b.tryAdd(i, 10))
	}
	require.Equal(t, []int{0, 1}, b.takeBatch())
	require.Equal(t, []int{2}, <-ran, "after the delay the batcher runs what is left")
	require.Nil(t, b.takeBatch())

	release := b.hold()
	require.True(t, b.tryAdd(3, 10))
	require.Nil(t, b.takeBatch(), "a held batcher gives nothing away")
	release()
	require.Equal(t, []int{3}, <-ran)
}
