package dispatcher_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestListCountsLagUpToACap: the lag of a row far behind (a consumer
// renamed or removed and disabled, as the retention docs advise, whose
// cursor stays while the log grows) was counted event by event on every
// list and status call, which the admin page makes every 2 seconds: 5 to
// 15 s per call at 3 million events. The count stops at a cap, and the row
// says so.
func TestListCountsLagUpToACap(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	newDispatcher(t, b, nil) // registers test:a at the start of the log
	b.write(t, "t1", 0, 5, 1)

	rows, err := dispatcher.ListWithLagCap(context.Background(), b.db.Pool, 3)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, int64(3), rows[0].Lag)
	require.True(t, rows[0].LagCapped)
	out, err := json.Marshal(rows[0])
	require.NoError(t, err)
	require.Contains(t, string(out), `"lag":3,"lagCapped":true`)

	rows, err = dispatcher.ListWithLagCap(context.Background(), b.db.Pool, 5)
	require.NoError(t, err)
	require.Equal(t, int64(5), rows[0].Lag)
	require.False(t, rows[0].LagCapped)
	require.Equal(t, int64(5), status(t, b, "test:a", "").Lag, "status counts up to LagCountCap")
}
