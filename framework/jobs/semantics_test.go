package jobs_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestUniqueWindowEnds: an equal dispatch while a Unique job's run waits
// or runs is ErrDuplicate, but only within the window: once it has passed
// an equal dispatch runs although the first run is still going; and once a
// run succeeded an equal dispatch runs at once.
func TestUniqueWindowEnds(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var ran atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "u", &jobs.Options{Unique: time.Second}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			if ran.Add(1) == 1 {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return insertRun(ctx, jc, jc.Job, in.Report, jc.TaskID)
		})
	})
	r := b.runner(t, nil)
	ctx := context.Background()
	dispatch := func() error {
		_, err := r.Client().Dispatch(ctx, "test:job:u", exportInput{Report: "r"}, &jobs.DispatchOptions{TenantID: "acme"})
		return err
	}
	require.NoError(t, dispatch())
	eventually(t, "the first run to start", func() bool { return ran.Load() == 1 })
	require.ErrorIs(t, dispatch(), jobs.ErrDuplicate)
	time.Sleep(1200 * time.Millisecond)
	require.NoError(t, dispatch(), "the window has passed")
	eventually(t, "the second run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 1 })
	close(release)
	eventually(t, "the first run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 2 })
	drained(t, r.Inspector())
	require.NoError(t, dispatch(), "no equal run waits or runs")
	eventually(t, "the third run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 3 })
}

// TestDispatchWhileRedisIsDown: a direct dispatch while Redis is
// unreachable fails within the enqueue timeout with a CodeUnavailable
// error wrapping an *EnqueueError, and leaves nothing behind: once Redis is
// back no run of it appears; a dispatch then runs once.
func TestDispatchWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "export", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			ran.Add(1)
			return insertRun(ctx, jc, jc.Job, in.Report, "")
		})
	})
	r, err := jobs.New(b.rt, b.rdb, &jobs.Config{Metrics: b.prom, EnqueueTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	b.redis.Stop()
	ctx := context.Background()
	start := time.Now()
	_, err = r.Client().Dispatch(ctx, "test:job:export", exportInput{Report: "lost"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.Error(t, err)
	require.Less(t, time.Since(start), 3*time.Second)
	require.Equal(t, framework.CodeUnavailable, framework.ToError(err).Code)
	var ee *jobs.EnqueueError
	require.True(t, errors.As(err, &ee), "got %v", err)
	_, err = r.Client().Dispatch(ctx, "test:job:export", exportInput{Report: "lost"}, &jobs.DispatchOptions{TenantID: "acme", Key: "k"})
	require.Equal(t, framework.CodeUnavailable, framework.ToError(err).Code)

	b.redis.Start()
	b.runner(t, nil)
	_, err = r.Client().Dispatch(ctx, "test:job:export", exportInput{Report: "ok"}, &jobs.DispatchOptions{TenantID: "acme", Key: "k"})
	require.NoError(t, err, "the failed keyed dispatch took no key")
	eventually(t, "the run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 1 })
	drained(t, r.Inspector())
	require.Equal(t, int64(1), ran.Load())
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'lost'`))
}
