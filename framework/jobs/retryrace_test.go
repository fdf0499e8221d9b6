package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestRetryRacingAnEqualDispatchTakesTheWindowOnce: an operator retries a
// Unique job's run that was archived still holding its uniqueness lock
// (as a run whose workers died is), while an equal dispatch arrives. One
// of the two may have the window, never both: the dispatch frees a lock
// held by an archived run, and it must not free the lock the retry has
// just taken for that very run before asynq marked it pending (then both
// would wait to run, side by side in the window). Nothing runs the queue
// here, so every accepted run stays pending; the race is repeated with a
// fresh pair of runs each round.
func TestRetryRacingAnEqualDispatchTakesTheWindowOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "u", &jobs.Options{Unique: time.Hour}, func(context.Context, *jobs.Context, exportInput) error {
			return nil
		})
	})
	r, err := jobs.New(b.rt, b.rdb, nil)
	require.NoError(t, err)
	aq := asynq.NewInspectorFromRedisClient(b.rdb)
	ctx := context.Background()
	dispatch := func(report string) (string, error) {
		return r.Client().Dispatch(ctx, "test:job:u", exportInput{Report: report}, &jobs.DispatchOptions{TenantID: "acme"})
	}
	both := 0
	for round := range 60 {
		report := fmt.Sprint("r", round)
		id, err := dispatch(report)
		require.NoError(t, err)
		ti, err := r.Inspector().Get(ctx, "", id)
		require.NoError(t, err)
		// Archived with its lock held, as asynq's recoverer archives a run
		// whose workers died.
		require.NoError(t, aq.ArchiveTask(ti.Queue, id))

		var wg sync.WaitGroup
		var retryErr, dispatchErr error
		wg.Go(func() { _, retryErr = r.Inspector().Retry(ctx, "", id) })
		wg.Go(func() { _, dispatchErr = dispatch(report) })
		wg.Wait()
		for _, err := range []error{retryErr, dispatchErr} {
			if err != nil && !errors.Is(err, jobs.ErrDuplicate) {
				require.NoError(t, err)
			}
		}
		if retryErr == nil && dispatchErr == nil {
			both++
		}
		// Every round leaves exactly one run of its report waiting.
		q, err := aq.GetQueueInfo(ti.Queue)
		require.NoError(t, err)
		require.Equal(t, round+1, q.Pending, "round %d: one run of the report waits (retry: %v, dispatch: %v)", round, retryErr, dispatchErr)
	}
	require.Zero(t, both, "retry and equal dispatch both took the window")
}
