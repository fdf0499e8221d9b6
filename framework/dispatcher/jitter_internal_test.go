package dispatcher

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// jitter spreads any interval by ±20% without overflowing: a poll interval
// of "practically never" set in code must not panic the poll loop or turn
// into a negative wait that spins it.
func TestJitterOfHugeIntervals(t *testing.T) {
	for _, iv := range []time.Duration{0, 1, 10, time.Second, math.MaxInt64 / 4, math.MaxInt64} {
		for range 100 {
			j := jitter(iv)
			want := min(iv, maxJitterable)
			require.GreaterOrEqual(t, j, want/10*8, iv)
			require.LessOrEqual(t, j, want/10*12, iv)
		}
	}
}
