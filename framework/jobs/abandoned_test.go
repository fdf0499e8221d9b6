package jobs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestAbandonedRunCommitsNothing: a run that outlasts its Timeout fails,
// and what its abandoned handler does afterwards commits nothing: neither
// the transaction it was inside when the run ended, nor one it opens later
// on the run's context, nor one it opens on a context of its own (the run
// has failed and is retried or archived: its writes must not appear
// behind it). A handler that opened its transaction on
// context.WithoutCancel committed it after its run was archived.
func TestAbandonedRunCommitsNothing(t *testing.T) {
	t.Parallel()
	var returned sync.WaitGroup
	returned.Add(3)
	results := make(chan error, 3)
	opts := &jobs.Options{Timeout: 300 * time.Millisecond, MaxRetries: -1}
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "inside", opts, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			defer returned.Done()
			err := jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO runs (tenant_id, job, ref) VALUES ($1, $2, 'inside')`, tx.TenantID(), jc.Job); err != nil {
					return err
				}
				time.Sleep(2 * time.Second) // deaf to ctx
				return nil
			})
			results <- err
			return err
		})
		jobs.Manual[exportInput](b.f, "after", opts, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			defer returned.Done()
			time.Sleep(2 * time.Second)
			err := insertRun(ctx, jc, jc.Job, "after", "")
			results <- err
			return err
		})
		jobs.Manual[exportInput](b.f, "detached", opts, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			defer returned.Done()
			time.Sleep(2 * time.Second)
			err := insertRun(context.WithoutCancel(ctx), jc, jc.Job, "detached", "")
			results <- err
			return err
		})
	})
	r := b.runner(t, nil)
	for _, job := range []string{"inside", "after", "detached"} {
		_, err := r.Client().Dispatch(context.Background(), "test:job:"+job, exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
		require.NoError(t, err)
	}
	eventually(t, "three archived runs", func() bool {
		a, err := r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		return len(a) == 3
	})
	returned.Wait()
	close(results)
	var errs []error
	for err := range results {
		require.Error(t, err, "an abandoned run's transaction fails")
		errs = append(errs, err)
	}
	var rows []string
	rs, err := b.db.Pool.Query(context.Background(), `SELECT job FROM runs`)
	require.NoError(t, err)
	for rs.Next() {
		var j string
		require.NoError(t, rs.Scan(&j))
		rows = append(rows, j)
	}
	require.NoError(t, rs.Err())
	require.Empty(t, rows, "an abandoned run commits nothing (errors %v)", errs)
}
