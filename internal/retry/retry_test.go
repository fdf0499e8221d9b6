package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/internal/retry"
)

var errDown = errors.New("down")

func TestUntilRetriesWithDoublingWaits(t *testing.T) {
	t.Parallel()
	calls := 0
	var waits []time.Duration
	ok := retry.Until(context.Background(), func(context.Context) error {
		calls++
		if calls < 4 {
			return errDown
		}
		return nil
	}, func(err error, in time.Duration) bool {
		require.ErrorIs(t, err, errDown)
		waits = append(waits, in)
		return true
	})
	require.True(t, ok)
	require.Equal(t, 4, calls)
	require.Equal(t, []time.Duration{retry.First, 2 * retry.First, 4 * retry.First}, waits)
}

func TestUntilGivesUp(t *testing.T) {
	t.Parallel()
	calls := 0
	ok := retry.Until(context.Background(), func(context.Context) error { calls++; return errDown },
		func(error, time.Duration) bool { return false })
	require.False(t, ok)
	require.Equal(t, 1, calls)
}

func TestUntilStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	start := time.Now()
	ok := retry.Until(ctx, func(context.Context) error { return errDown }, func(error, time.Duration) bool { return true })
	require.False(t, ok)
	require.Less(t, time.Since(start), 2*time.Second, "waited past the context's end")
}
