package jobs_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestRetriedArchivedUniqueRunHoldsItsWindow: an archived run of a Unique
// job that an operator retries is waiting, then running, again: an equal
// dispatch meanwhile is ErrDuplicate, as for any equal run that waits or
// runs (it was accepted, and the two ran side by side: the archiving had
// freed the window, and the retry did not take it again). While an equal
// run holds the window the retry is refused with ErrDuplicate. The effect
// behind HandledOnce happens once.
func TestRetriedArchivedUniqueRunHoldsItsWindow(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	var gate atomic.Pointer[chan struct{}]
	open := func() chan struct{} {
		ch := make(chan struct{})
		gate.Store(&ch)
		return ch
	}
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "u", &jobs.Options{Unique: time.Hour, MaxRetries: -1}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			if !healthy.Load() {
				return fmt.Errorf("report %s failed", in.Report)
			}
			select {
			case <-*gate.Load():
			case <-ctx.Done():
				return ctx.Err()
			}
			return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
				first, err := jobs.HandledOnce(ctx, tx, "u:"+in.Report)
				if err != nil || !first {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO effects (tenant_id, key) VALUES ($1, $2)`, tx.TenantID(), in.Report)
				return err
			})
		})
	})
	closed := make(chan struct{})
	close(closed)
	t.Cleanup(func() { gate.Store(&closed) })
	r := b.runner(t, nil)
	ctx := context.Background()
	dispatch := func() (string, error) {
		return r.Client().Dispatch(ctx, "test:job:u", exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
	}
	state := func(id string) jobs.State {
		ti, err := r.Inspector().Get(ctx, "", id)
		require.NoError(t, err)
		return ti.State
	}
	archived, err := dispatch()
	require.NoError(t, err)
	eventually(t, "the archived run", func() bool { return state(archived) == jobs.StateArchived })

	healthy.Store(true)
	first := open()
	equal, err := dispatch()
	require.NoError(t, err, "the archived run holds no window")
	eventually(t, "the equal run to start", func() bool { return state(equal) == jobs.StateActive })
	_, err = r.Inspector().Retry(ctx, "", archived)
	require.ErrorIs(t, err, jobs.ErrDuplicate, "an equal run holds the window")
	require.Equal(t, jobs.StateArchived, state(archived))
	close(first)
	drained(t, r.Inspector())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))

	second := open()
	_, err = r.Inspector().Retry(ctx, "", archived)
	require.NoError(t, err)
	_, err = dispatch()
	require.ErrorIs(t, err, jobs.ErrDuplicate, "the retried run waits or runs: an equal dispatch is refused")
	close(second)
	drained(t, r.Inspector())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`), "HandledOnce: the effect happened once")
	_, err = dispatch()
	require.NoError(t, err, "the retried run succeeded: its window is free")
}
