package dispatcher_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestReserveCreatesMissingRowsOnly: a reserved consumer (one the process
// does not run) gets its shared rows at the start of the log when it has
// none, and keeps the rows it has, in whatever partitioning, as they are.
func TestReserveCreatesMissingRowsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, "t1", 0, 2, 2)
	reserve := func(parts int) {
		t.Helper()
		d, err := dispatcher.New(b.db.Pool, b.reg, nil, &dispatcher.Config{InstanceID: "r",
			Reserve: []dispatcher.Consumer{{Name: "test:kept", EventTypes: []string{"test:event:noted"}, Partitions: parts}}})
		require.NoError(t, err)
		require.NoError(t, d.Register(context.Background()))
		_, err = d.RunOnce(context.Background(), "test:kept@0")
		require.Error(t, err, "a reserved consumer runs no pass")
	}
	reserve(2)
	rows := `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:kept%' AND instance_id = '__shared__'
  AND cursor_position = 0 AND partition_count = 2 AND event_types = '{test:event:noted}'`
	require.Equal(t, 2, count(t, b, rows))
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE event_consumers SET cursor_position = 1 WHERE name = 'test:kept@1'`)
	require.NoError(t, err)
	reserve(3)
	require.Equal(t, 2, count(t, b, `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:kept%'`))
	require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_consumers WHERE name = 'test:kept@1' AND cursor_position = 1`))
}
