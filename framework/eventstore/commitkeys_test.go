package eventstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// TestCheckCommitKeys: a log whose largest commit key is not below the
// server's next transaction id (as after a pg_dump/pg_restore into a new
// cluster, simulated here by a superuser UPDATE) fails the check with the
// pg_resetwal epoch that repairs it; a healthy log, empty or not, passes.
func TestCheckCommitKeys(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	require.NoError(t, eventstore.CheckCommitKeys(ctx, db.Pool), "an empty log")
	out := appendTx(t, db.Pool, stream("a"), eventstore.NoStream, ev("thing:event:made", 1), ev("thing:event:made", 2))
	require.NoError(t, eventstore.CheckCommitKeys(ctx, db.Pool), "a log written by this server")

	var next uint64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())`).Scan(&next))
	epoch := next>>32 + 3
	ahead := epoch<<32 | 7
	_, err := db.Pool.Exec(ctx, `UPDATE events SET commit_key = $1::text::xid8 WHERE position = $2`,
		fmt.Sprint(ahead), out[1].Position)
	require.NoError(t, err)

	err = eventstore.CheckCommitKeys(ctx, db.Pool)
	var ahErr *eventstore.CommitKeyAheadError
	require.True(t, errors.As(err, &ahErr), "%v", err)
	require.Equal(t, ahead, ahErr.MaxCommitKey)
	require.Less(t, ahErr.NextXID, ahead)
	require.Equal(t, epoch+1, ahErr.Epoch())
	require.Contains(t, err.Error(), fmt.Sprintf("pg_resetwal -e %d ", epoch+1))
	require.Contains(t, err.Error(), "dump")

	// A key only a little ahead, in the same epoch, fails too.
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())`).Scan(&next))
	_, err = db.Pool.Exec(ctx, `UPDATE events SET commit_key = $1::text::xid8 WHERE position = $2`,
		fmt.Sprint(next+1000), out[1].Position)
	require.NoError(t, err)
	require.True(t, errors.As(eventstore.CheckCommitKeys(ctx, db.Pool), &ahErr))
}

// TestCheckCommitKeysCursorAheadOfPrunedLog: a restored database whose
// events were pruned (every type pruned, or the newest) still has its
// consumers' cursors at the old cluster's keys, and an event appended
// there would sort behind them and never be delivered: the check fails,
// naming an epoch above the cursors.
func TestCheckCommitKeysCursorAheadOfPrunedLog(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	var next uint64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())`).Scan(&next))
	epoch := next>>32 + 2
	ahead := epoch<<32 | 9
	_, err := db.Pool.Exec(ctx, `INSERT INTO event_consumers (name, instance_id, cursor_commit_key, cursor_position)
		VALUES ('projection:pruned', '__shared__', $1::text::xid8, 42)`, fmt.Sprint(ahead))
	require.NoError(t, err)

	err = eventstore.CheckCommitKeys(ctx, db.Pool)
	var ahErr *eventstore.CommitKeyAheadError
	require.True(t, errors.As(err, &ahErr), "an empty log behind a cursor ahead: %v", err)
	require.Equal(t, ahead, ahErr.MaxCommitKey)
	require.Equal(t, epoch+1, ahErr.Epoch())

	// With events below the cursor, the cursor still decides.
	appendTx(t, db.Pool, stream("a"), eventstore.NoStream, ev("thing:event:made", 1))
	require.True(t, errors.As(eventstore.CheckCommitKeys(ctx, db.Pool), &ahErr))
	require.Equal(t, ahead, ahErr.MaxCommitKey)
}
