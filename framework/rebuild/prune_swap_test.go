package rebuild_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// TestSwapWaitingForAPruneDoesNotBlockReaders: an events prune holds the
// consumer table in SHARE mode while it runs, so the swap's hand-over of
// the cursor waits for it. The swap must wait without holding the live
// table: it used to drop the live table first (ACCESS EXCLUSIVE) and then
// wait for the consumer table, up to SwapLockTimeout per attempt and
// attempt after attempt for as long as the prune ran, so every reader of
// the projection's table stalled behind it.
func TestSwapWaitingForAPruneDoesNotBlockReaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:tally")
	b.count(t, "t1", "a", 0, 10)
	b.drain(t, d, "test:tally")

	// An earlier rebuild through the same pool: its swap's statements are
	// prepared on the connection the next rebuild gets, which then runs
	// them in batch order instead of parsing them all first (a parse
	// waits for the table's lock before anything ran).
	first, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", nil)
	require.NoError(t, err)
	require.EqualValues(t, 10, first.Events)

	const hold = 1500 * time.Millisecond
	var once sync.Once
	var wg sync.WaitGroup
	defer wg.Wait()
	blocked := make(chan error, 100)
	res, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{
		SwapLockTimeout: 3 * time.Second,
		Progress: func(p rebuild.Progress) {
			if p.Phase != rebuild.PhaseSwap {
				return
			}
			once.Do(func() {
				// A prune starts: it holds the consumer table in SHARE mode
				// until it commits.
				prune, err := b.db.Pool.Begin(ctx)
				require.NoError(t, err)
				_, err = prune.Exec(ctx, `LOCK TABLE event_consumers IN SHARE MODE`)
				require.NoError(t, err)
				wg.Go(func() {
					defer func() { _ = prune.Rollback(ctx) }()
					// Readers of the projection's table meanwhile.
					deadline := time.Now().Add(hold)
					for time.Now().Before(deadline) {
						err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
							if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '300ms'`); err != nil {
								return err
							}
							var n int64
							return tx.QueryRow(ctx, `SELECT count(*) FROM tally`).Scan(&n)
						})
						if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55P03" {
							blocked <- err
						} else if err != nil && !errors.As(err, &pgErr) {
							blocked <- err
						}
						time.Sleep(50 * time.Millisecond)
					}
				})
			})
		},
	})
	require.NoError(t, err)
	wg.Wait()
	close(blocked)
	var errs []error
	for err := range blocked {
		errs = append(errs, err)
	}
	require.Empty(t, errs, "readers of the live table waited for the swap while it waited for the prune")
	require.EqualValues(t, 10, res.Events)
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table)
}
