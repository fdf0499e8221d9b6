package jobs_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// A run of a job this build does not declare (one renamed or removed by a
// release while its runs still wait, or one of a newer release picked up
// by an older process) fails as a run of that job: counted in
// kumiko_jobs_failed_total and, once its retries are exhausted,
// kumiko_jobs_archived_total under its own name, and logged, so that the
// alert on archived runs fires. It never runs another job's handler.
// Before, asynq's mux matched the task type by prefix: a run of
// test:job:export-v2 ran test:job:export's handler with its payload; and a
// type no handler prefixed failed inside asynq, invisible to the metrics.
func TestRunOfAnUndeclaredJobFailsVisibly(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "export", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			ran.Add(1)
			return nil
		})
	})
	r := b.runner(t, nil)
	aq := asynq.NewClientFromRedisClient(b.rdb)
	queue := jobs.QueueName("", framework.RunInWorker, jobs.PriorityDefault)
	for _, typ := range []string{"test:job:export-v2", "gone:job:other"} {
		_, err := aq.Enqueue(asynq.NewTask(typ, []byte(`{"tenant":"acme","payload":{"report":"r1"}}`)),
			asynq.Queue(queue), asynq.MaxRetry(0))
		require.NoError(t, err)
	}
	for _, typ := range []string{"test:job:export-v2", "gone:job:other"} {
		eventually(t, typ+" archived and counted", func() bool {
			return metric(t, b, "kumiko_jobs_archived_total", "lane", "worker", "job", typ) == 1
		})
		require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_failed_total", "lane", "worker", "job", typ))
	}
	require.Zero(t, ran.Load(), "test:job:export's handler ran a run of another job")
	archived, err := r.Inspector().List(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, archived, 2)
	for _, a := range archived {
		require.Contains(t, a.LastError, "not declared")
	}
}
