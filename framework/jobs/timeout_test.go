package jobs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestTimeoutBelowASecondEndsTheRun: Options.Timeout bounds a run also
// when it is not a whole number of seconds. asynq keeps a task's timeout in
// whole seconds, so a 300 ms timeout became none at all (asynq's 30 minute
// default) and a 1.5 s one 1 s.
func TestTimeoutBelowASecondEndsTheRun(t *testing.T) {
	t.Parallel()
	type ended struct {
		after time.Duration
		err   error
	}
	ch := make(chan ended, 4)
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "bounded", &jobs.Options{Timeout: 300 * time.Millisecond, MaxRetries: -1},
			func(ctx context.Context, jc *jobs.Context, in exportInput) error {
				start := time.Now()
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
				}
				ch <- ended{after: time.Since(start), err: ctx.Err()}
				return ctx.Err()
			})
	})
	r := b.runner(t, nil)
	_, err := r.Client().Dispatch(context.Background(), "test:job:bounded", exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	var e ended
	select {
	case e = <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("the run did not end")
	}
	require.True(t, errors.Is(e.err, context.DeadlineExceeded), "the run's context must end with its timeout, got %v", e.err)
	require.Less(t, e.after, 5*time.Second, "a 300 ms timeout must end the run long before 10 s")
	eventually(t, "the timed-out run archived", func() bool {
		a, err := r.Inspector().List(context.Background(), nil)
		require.NoError(t, err)
		return len(a) == 1
	})
}
