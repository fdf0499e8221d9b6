package jobs_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestEventJobRunsOnceDespiteRedelivery makes the job-trigger consumer
// deliver every event twice (its pass fails after the enqueue, as after a
// crash before the cursor committed) and then re-read the whole log (a
// rewound cursor): each event's job still runs exactly once. The job has no
// HandledOnce guard, so only the derived task ids keep it from running
// twice.
func TestEventJobRunsOnceDespiteRedelivery(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.OnEvent(b.f, "count", b.noted, nil, func(ctx context.Context, jc *jobs.Context, e framework.Event[noted]) error {
			runs.Add(1)
			return insertRun(ctx, jc, jc.Job, strconv.FormatInt(e.ID, 10), "")
		})
	})
	r := b.runner(t, nil)

	// Every event's first Apply enqueues and then fails (a crash after the
	// enqueue): the pass rolls back and the event is delivered again.
	c := r.Consumer()
	inner := c.Apply
	var mu sync.Mutex
	seen := map[int64]int{}
	c.Apply = func(ctx context.Context, tx *framework.Tx, env framework.Envelope) error {
		if err := inner(ctx, tx, env); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		seen[env.Position]++
		if seen[env.Position] == 1 {
			return &jobs.EnqueueError{Job: "injected", Err: errors.New("crash after enqueue")}
		}
		return nil
	}
	b.dispatch(t, c)

	const n = 20
	b.write(t, "acme", 0, n)
	delivered := func(times int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, k := range seen {
				if k < times {
					return false
				}
			}
			return len(seen) == n
		}
	}
	eventually(t, "every event delivered to the trigger consumer twice", delivered(2))
	eventually(t, "20 runs", func() bool { return b.count(t, `SELECT count(*) FROM runs`) >= n })
	drained(t, r.Inspector())

	// Rewind the cursor as an operator would (under the consumer's lock, so
	// that a pass still in flight cannot write its cursor over the rewind):
	// the consumer re-reads and re-enqueues everything.
	_, err := dispatcher.Rewind(context.Background(), b.db.Pool, jobs.ConsumerName, dispatcher.SharedInstance, dispatcher.RewindTo{})
	require.NoError(t, err)
	eventually(t, "the rewound consumer to deliver everything again", delivered(3))
	drained(t, r.Inspector())

	require.Equal(t, int64(n), runs.Load())
	require.Equal(t, n, b.count(t, `SELECT count(DISTINCT ref) FROM runs`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM event_consumers WHERE status <> 'idle'`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM event_dead_letters`))
	require.Equal(t, float64(n), metric(t, b, "kumiko_jobs_enqueued_total", "job", "test:job:count"))
	require.Equal(t, float64(n), metric(t, b, "kumiko_jobs_succeeded_total", "job", "test:job:count"))
	require.Equal(t, float64(n), metric(t, b, "kumiko_jobs_event_to_start_seconds", "job", "test:job:count"))
}

// TestEventJobContextAndTenantScope checks what an event job gets: the
// typed event, the tenant, correlation and causation ids, and a transaction
// that row-level security confines to the event's tenant.
func TestEventJobContextAndTenantScope(t *testing.T) {
	t.Parallel()
	type observed struct {
		jc         jobs.Context
		e          framework.Event[noted]
		visible    int
		crossError error
	}
	ch := make(chan observed, 1)
	b := setup(t, func(b *bundle) {
		jobs.OnEvent(b.f, "inspect", b.noted, nil, func(ctx context.Context, jc *jobs.Context, e framework.Event[noted]) error {
			o := observed{jc: *jc, e: e}
			err := jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
				return tx.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&o.visible)
			})
			if err != nil {
				return err
			}
			o.crossError = jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
				_, err := tx.Exec(ctx, `INSERT INTO effects (tenant_id, key) VALUES ('globex', 'sneaky')`)
				return err
			})
			ch <- o
			return nil
		})
	})
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO effects VALUES ('acme', 'a'), ('globex', 'g1'), ('globex', 'g2')`)
	require.NoError(t, err)
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	b.write(t, "acme", 7, 1)

	var o observed
	select {
	case o = <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not run")
	}
	pos := strconv.FormatInt(o.e.ID, 10)
	require.Equal(t, 7, o.e.Payload.N)
	require.Equal(t, "test:event:noted", o.e.Type)
	require.Equal(t, framework.Stream{Type: "s", ID: "7"}, o.e.Stream)
	require.Equal(t, "acme", o.e.TenantID)
	require.Equal(t, "test:job:inspect", o.jc.Job)
	require.Equal(t, "test:job:inspect@event-"+pos, o.jc.TaskID)
	require.Equal(t, framework.RunInWorker, o.jc.Lane)
	require.Equal(t, "acme", o.jc.TenantID)
	require.Equal(t, "corr-7", o.jc.CorrelationID)
	require.Equal(t, pos, o.jc.CausationID)
	require.Equal(t, 0, o.jc.Retry)
	require.Equal(t, 10, o.jc.MaxRetry)
	require.Equal(t, 1, o.visible, "the job's transaction must see only its tenant's rows")
	require.Error(t, o.crossError, "the job's transaction must not write another tenant's rows")
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM effects WHERE key = 'sneaky'`))
}

// TestRedisOutageLosesNothing kills the Redis server while events are
// written: the job-trigger consumer fails transiently (never dead, no
// attempts counted, no transaction held while it waits), and once Redis is
// back every job runs exactly once.
func TestRedisOutageLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.OnEvent(b.f, "count", b.noted, nil, func(ctx context.Context, jc *jobs.Context, e framework.Event[noted]) error {
			return insertRun(ctx, jc, jc.Job, strconv.FormatInt(e.ID, 10), "")
		})
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	b.write(t, "acme", 0, 1)
	eventually(t, "the first run", func() bool { return b.count(t, `SELECT count(*) FROM runs`) == 1 })
	drained(t, r.Inspector())

	b.redis.Stop()
	b.write(t, "acme", 1, 30)
	type row struct {
		status   string
		attempts int
		lastErr  *string
	}
	state := func() row {
		var s row
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT status, attempts, last_error FROM event_consumers WHERE name = $1`, jobs.ConsumerName).Scan(&s.status, &s.attempts, &s.lastErr))
		return s
	}
	eventually(t, "the consumer to record the transient failure", func() bool { return state().lastErr != nil })
	// While it waits the consumer stays idle, counts no attempt and holds no
	// transaction open (an enqueue fails within EnqueueTimeout, 2 s).
	for range 10 {
		s := state()
		require.Equal(t, "idle", s.status)
		require.Equal(t, 0, s.attempts)
		require.Contains(t, *s.lastErr, "jobs: enqueue test:job:count")
		require.Zero(t, b.count(t, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start < now() - interval '2500 milliseconds'`))
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs`))

	b.redis.Start()
	eventually(t, "all 31 runs", func() bool { return b.count(t, `SELECT count(*) FROM runs`) >= 31 })
	drained(t, r.Inspector())
	require.Equal(t, 31, b.count(t, `SELECT count(*) FROM runs`))
	require.Equal(t, 31, b.count(t, `SELECT count(DISTINCT ref) FROM runs`))
	s := state()
	require.Equal(t, "idle", s.status)
	require.Nil(t, s.lastErr)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM event_dead_letters`))
}

// TestDispatchOfUnknownJobIsDeadLettered: a dispatch event naming a job
// this build does not have (a deploy skew) is dead-lettered and does not
// block the jobs after it.
func TestDispatchOfUnknownJobIsDeadLettered(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	var job jobs.ManualJob[noted]
	b := setup(t, func(b *bundle) {
		job = jobs.Manual[noted](b.f, "known", nil, func(ctx context.Context, jc *jobs.Context, in noted) error {
			ran.Add(1)
			return nil
		})
	})
	r := b.runner(t, nil)
	d, err := dispatcher.New(b.db.Pool, b.reg, []dispatcher.Consumer{r.Consumer()}, &dispatcher.Config{InstanceID: "i1"})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	// An event as an older build would have written it.
	_, err = b.db.Pool.Exec(context.Background(), `INSERT INTO streams VALUES ('acme', 'job-dispatch', 'x', 1, pg_current_xact_id());
		INSERT INTO events (position, commit_key, tenant_id, stream_type, stream_id, version, type, payload)
		VALUES (nextval('kumiko_event_position_seq'), pg_current_xact_id(), 'acme', 'job-dispatch', 'x', 1, 'jobs:event:dispatched', '{"job":"test:job:gone"}')`)
	require.NoError(t, err)
	_, err = b.rt.InTx(context.Background(), "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		return job.DispatchTx(ctx, tx, noted{N: 1}, nil)
	})
	require.NoError(t, err)
	eventually(t, "both events passed", func() bool {
		_, err := d.RunOnce(context.Background(), jobs.ConsumerName)
		require.NoError(t, err)
		return b.count(t, `SELECT count(*) FROM event_dead_letters`) == 1 && ran.Load() == 1
	})
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM event_dead_letters WHERE error LIKE '%unknown manual job "test:job:gone"%'`))
	require.Equal(t, "idle", func() string {
		var s string
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT status FROM event_consumers WHERE name = $1`, jobs.ConsumerName).Scan(&s))
		return s
	}())
}

// kumiko_jobs_event_to_start_seconds measures how long the event took to
// reach its run: one sample per event run, taken when the run first
// starts. A retry is no new delivery of the event: before, every attempt
// observed the event's age again, so a run retried after its backoff added
// a sample that measured the backoff (and one retried by an operator days
// later, days), and the histogram's count was the attempts, not the runs.
func TestEventToStartObservedOncePerRun(t *testing.T) {
	t.Parallel()
	const backoff = 3 * time.Second
	var attempts atomic.Int64
	b := setup(t, func(b *bundle) {
		jobs.OnEvent(b.f, "flaky", b.noted, &jobs.Options{MaxRetries: 3, Backoff: func(int) time.Duration { return backoff }},
			func(ctx context.Context, jc *jobs.Context, e framework.Event[noted]) error {
				if attempts.Add(1) < 3 {
					return errors.New("not yet")
				}
				return nil
			})
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	b.write(t, "acme", 0, 1)
	eventually(t, "the run to succeed on its third attempt", func() bool {
		return metric(t, b, "kumiko_jobs_succeeded_total", "job", "test:job:flaky") == 1
	})
	require.Equal(t, float64(2), metric(t, b, "kumiko_jobs_failed_total", "job", "test:job:flaky"))
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_event_to_start_seconds", "job", "test:job:flaky"),
		"one sample for the one run, not one per attempt")
	fams, err := b.prom.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() == "kumiko_jobs_event_to_start_seconds" {
			require.Less(t, f.GetMetric()[0].GetHistogram().GetSampleSum(), backoff.Seconds(), "the sample holds no backoff")
		}
	}
}
