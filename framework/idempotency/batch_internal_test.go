package idempotency

import (
	"testing"

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
