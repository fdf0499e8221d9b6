package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

type exportInput struct {
	Report string `json:"report" validate:"required,max=20"`
}

// TestDispatchTx: a dispatch is part of the caller's transaction (it runs
// after a commit, never after a rollback), carries the transaction's tenant
// and correlation id, and a Key makes it run once.
func TestDispatchTx(t *testing.T) {
	t.Parallel()
	var export jobs.ManualJob[exportInput]
	b := setup(t, func(b *bundle) {
		export = jobs.Manual[exportInput](b.f, "export", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			return insertRun(ctx, jc, jc.Job, in.Report, jc.CorrelationID+"|"+jc.CausationID+"|"+jc.UserID)
		})
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())

	write := func(tenant, corr string, fn func(ctx context.Context, tx *framework.Tx) error) error {
		_, err := b.rt.InTx(context.Background(), tenant, framework.Metadata{UserID: "alice", CorrelationID: corr}, fn)
		return err
	}
	require.NoError(t, write("acme", "corr-commit", func(ctx context.Context, tx *framework.Tx) error {
		return export.DispatchTx(ctx, tx, exportInput{Report: "committed"}, nil)
	}))
	require.Error(t, write("acme", "corr-rollback", func(ctx context.Context, tx *framework.Tx) error {
		if err := export.DispatchTx(ctx, tx, exportInput{Report: "rolled-back"}, nil); err != nil {
			return err
		}
		return errors.New("the business write fails")
	}))
	// Invalid payloads and unknown jobs fail at the call site.
	var ve *framework.ValidationError
	require.ErrorAs(t, write("acme", "x", func(ctx context.Context, tx *framework.Tx) error {
		return export.DispatchTx(ctx, tx, exportInput{}, nil)
	}), &ve)
	require.Equal(t, "report", ve.Fields[0].Field)
	require.ErrorIs(t, write("acme", "x", func(ctx context.Context, tx *framework.Tx) error {
		return jobs.For(b.reg).DispatchTx(ctx, tx, "test:job:nope", exportInput{Report: "x"}, nil)
	}), jobs.ErrUnknownJob)
	// Keyed: two transactions, one run.
	for i := range 2 {
		require.NoError(t, write("globex", fmt.Sprint("corr-key-", i), func(ctx context.Context, tx *framework.Tx) error {
			return jobs.For(b.reg).DispatchTx(ctx, tx, "test:job:export", map[string]any{"report": "keyed"}, &jobs.DispatchOptions{Key: "monthly-2026-11"})
		}))
	}

	eventually(t, "two runs", func() bool { return b.count(t, `SELECT count(*) FROM runs`) >= 2 })
	drained(t, r.Inspector())
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM runs`))
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'rolled-back'`))
	var tenant, info string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT tenant_id, info FROM runs WHERE ref = 'committed'`).Scan(&tenant, &info))
	var pos int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT position FROM events WHERE type = 'jobs:event:dispatched' AND tenant_id = 'acme'`).Scan(&pos))
	require.Equal(t, "acme", tenant)
	require.Equal(t, "corr-commit|"+strconv.FormatInt(pos, 10)+"|alice", info)
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'keyed' AND tenant_id = 'globex'`))
}

// TestClientDispatch: direct dispatch checks its payload, and Key and
// Unique make equal dispatches one run.
func TestClientDispatch(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "export", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			return insertRun(ctx, jc, jc.Job, in.Report, jc.TenantID+"|"+jc.CorrelationID+"|"+jc.CausationID)
		})
		jobs.Manual[exportInput](b.f, "slow", &jobs.Options{Unique: time.Minute}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			<-release
			return insertRun(ctx, jc, jc.Job, in.Report, "")
		})
	})
	r := b.runner(t, nil)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	c := r.Client()
	ctx := context.Background()

	_, err := c.Dispatch(ctx, "test:job:export", exportInput{Report: "this report name is far too long"}, nil)
	var ve *framework.ValidationError
	require.ErrorAs(t, err, &ve)
	_, err = c.Dispatch(ctx, "test:job:export", map[string]any{"report": "x", "extra": 1}, nil)
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "extra", ve.Fields[0].Field)
	_, err = c.Dispatch(ctx, "test:job:unknown", exportInput{Report: "x"}, nil)
	require.ErrorIs(t, err, jobs.ErrUnknownJob)

	id, err := c.Dispatch(ctx, "test:job:export", exportInput{Report: "once"}, &jobs.DispatchOptions{TenantID: "acme", Key: "k1", CorrelationID: "c-1", CausationID: "cause-1"})
	require.NoError(t, err)
	id2, err := c.Dispatch(ctx, "test:job:export", exportInput{Report: "once"}, &jobs.DispatchOptions{TenantID: "acme", Key: "k1"})
	require.ErrorIs(t, err, jobs.ErrDuplicate)
	require.Equal(t, id, id2)
	// The same key of another tenant is another run.
	_, err = c.Dispatch(ctx, "test:job:export", exportInput{Report: "once"}, &jobs.DispatchOptions{TenantID: "globex", Key: "k1"})
	require.NoError(t, err)

	uid, err := c.Dispatch(ctx, "test:job:slow", exportInput{Report: "unique"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	uid2, err := c.Dispatch(ctx, "test:job:slow", exportInput{Report: "unique"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.ErrorIs(t, err, jobs.ErrDuplicate, "an equal run is waiting or running: the Unique window refuses a second")
	// The id answered is the run holding the window, not a fresh one that
	// was never enqueued.
	require.Equal(t, uid, uid2)
	close(release)

	eventually(t, "three runs", func() bool { return b.count(t, `SELECT count(*) FROM runs`) >= 3 })
	drained(t, r.Inspector())
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM runs`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE info = 'acme|c-1|cause-1'`))
}

// TestHandledOnceConcurrentClaims: of concurrent transactions claiming one
// key, exactly one sees true; a rolled-back claim frees the key; keys are
// per tenant.
func TestHandledOnceConcurrentClaims(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	claim := func(tenant, key string, fail bool) (bool, error) {
		var first bool
		_, err := b.rt.InTx(context.Background(), tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			var err error
			if first, err = jobs.HandledOnce(ctx, tx, key); err != nil {
				return err
			}
			if fail {
				return errors.New("the job's write fails")
			}
			return nil
		})
		return first, err
	}
	first, err := claim("acme", "k", true)
	require.Error(t, err)
	require.True(t, first)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM handled`), "a rolled-back claim leaves nothing")

	var wins atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			ok, err := claim("acme", "k", false)
			require.NoError(t, err)
			if ok {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(1), wins.Load())
	ok, err := claim("globex", "k", false)
	require.NoError(t, err)
	require.True(t, ok, "another tenant's claim of the same key is its own")
	_, err = claim("acme", "", false)
	require.Error(t, err)
}

// TestHandledOnceUnderDuplicateDeliveries delivers one logical job twelve
// times at once (twelve tasks, twelve concurrent workers): the guarded
// effect happens once.
func TestHandledOnceUnderDuplicateDeliveries(t *testing.T) {
	t.Parallel()
	var effects, runs atomic.Int64
	gate := make(chan struct{})
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "mail", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			runs.Add(1)
			<-gate // line the deliveries up so they claim at the same time
			return jc.InTx(ctx, func(ctx context.Context, tx *framework.Tx) error {
				first, err := jobs.HandledOnce(ctx, tx, "mail:"+in.Report)
				if err != nil || !first {
					return err
				}
				effects.Add(1)
				_, err = tx.Exec(ctx, `INSERT INTO effects (tenant_id, key) VALUES ($1, $2)`, tx.TenantID(), in.Report)
				return err
			})
		})
	})
	r := b.runner(t, &jobs.Config{Lanes: jobs.Lanes, Concurrency: 12})
	for range 12 {
		_, err := r.Client().Dispatch(context.Background(), "test:job:mail", exportInput{Report: "welcome"}, &jobs.DispatchOptions{TenantID: "acme"})
		require.NoError(t, err)
	}
	eventually(t, "twelve deliveries in flight", func() bool { return runs.Load() == 12 })
	close(gate)
	drained(t, r.Inspector())
	require.Equal(t, int64(1), effects.Load())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM effects`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM handled WHERE key = 'mail:welcome'`))
	require.Equal(t, float64(12), metric(t, b, "kumiko_jobs_succeeded_total", "job", "test:job:mail"))
}

type noteInput struct {
	Note string `json:"note"`
}

// TestDispatchBlankRawPayloadRunsWithZeroInput: a raw payload of nothing
// but whitespace is the zero input, like an empty one. Dispatch used to
// paste it into the task as it was (an invalid task, archived at once
// without a tenant) and DispatchTx failed to encode its event; both now
// enqueue a valid task that runs.
func TestDispatchBlankRawPayloadRunsWithZeroInput(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Manual[noteInput](b.f, "note", nil, func(ctx context.Context, jc *jobs.Context, in noteInput) error {
			return insertRun(ctx, jc, jc.Job, "note:"+in.Note, "")
		})
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	ctx := context.Background()

	_, err := r.Client().Dispatch(ctx, "test:job:note", json.RawMessage(" \n"), &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	_, err = r.Client().Dispatch(ctx, "test:job:note", json.RawMessage("\t{\"note\":\"padded\"} \n"), &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	_, err = b.rt.InTx(ctx, "globex", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		return jobs.For(b.reg).DispatchTx(ctx, tx, "test:job:note", json.RawMessage("\r\n "), nil)
	})
	require.NoError(t, err)

	eventually(t, "three runs", func() bool { return b.count(t, `SELECT count(*) FROM runs`) >= 3 })
	drained(t, r.Inspector())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE tenant_id = 'acme' AND ref = 'note:'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE tenant_id = 'acme' AND ref = 'note:padded'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE tenant_id = 'globex' AND ref = 'note:'`))
	archived, err := r.Inspector().List(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, archived)
}

// TestUniqueJobReReadBlocksNoLaterDispatch: the job-trigger consumer
// re-reading a dispatch whose run already finished (an operator rewound
// it, or its pass failed after the enqueue) is a duplicate, and leaves the
// job's Unique window alone: a later equal dispatch, with no equal run
// waiting or running, runs.
func TestUniqueJobReReadBlocksNoLaterDispatch(t *testing.T) {
	t.Parallel()
	var export jobs.ManualJob[exportInput]
	b := setup(t, func(b *bundle) {
		export = jobs.Manual[exportInput](b.f, "export", &jobs.Options{Unique: time.Hour}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			return insertRun(ctx, jc, jc.Job, in.Report, jc.TaskID)
		})
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	ctx := context.Background()
	dispatch := func(report string) {
		t.Helper()
		_, err := b.rt.InTx(ctx, "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return export.DispatchTx(ctx, tx, exportInput{Report: report}, nil)
		})
		require.NoError(t, err)
	}
	// ran waits for the run of a marker report: the consumer has read
	// every dispatch before it.
	ran := func(marker string) {
		t.Helper()
		dispatch(marker)
		eventually(t, marker, func() bool { return b.count(t, `SELECT count(*) FROM runs WHERE ref = $1`, marker) == 1 })
		drained(t, r.Inspector())
	}

	dispatch("r1")
	ran("marker-1")
	// Replay the log: the finished run of r1 is re-read, a duplicate.
	_, err := dispatcher.Rewind(ctx, b.db.Pool, jobs.ConsumerName, "", dispatcher.RewindTo{})
	require.NoError(t, err)
	ran("marker-2")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'r1'`), "the re-read enqueued nothing")

	// Nothing equal to r1 waits or runs: a new dispatch of it runs.
	dispatch("r1")
	ran("marker-3")
	require.Equal(t, 2, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'r1'`), "the second dispatch of r1 was dropped")
}

// TestContextDispatchRetriedParentDispatchesOnce: a job that dispatches
// children and then fails is retried, and its retry dispatches the same
// children again; they run once. The children have finished before the
// retry (their completed runs keep their ids taken), two dispatches of one
// job in one run are two children, and a caller's Key still names the
// child itself (the retry finds it too: see
// TestContextDispatchKeyedChildOfRetriedParent).
func TestContextDispatchRetriedParentDispatchesOnce(t *testing.T) {
	t.Parallel()
	type attempt struct {
		ids  []string
		errs []error
	}
	var (
		mu       sync.Mutex
		attempts []attempt
	)
	childDone := make(chan string, 16)
	fast := &jobs.Options{MaxRetries: 3, Backoff: func(int) time.Duration { return 10 * time.Millisecond }}
	b := setup(t, func(b *bundle) {
		child := func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			if err := insertRun(ctx, jc, jc.Job, in.Report, jc.CausationID); err != nil {
				return err
			}
			childDone <- in.Report
			return nil
		}
		typed := jobs.Manual[exportInput](b.f, "child", nil, child)
		jobs.Manual[exportInput](b.f, "unique-child", &jobs.Options{Unique: time.Hour}, child)
		jobs.Manual[exportInput](b.f, "parent", fast, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			var a attempt
			for _, d := range []struct {
				job, report, key string
			}{
				{"test:job:child", "c1", ""},
				{"test:job:child", "c2", ""},
				{"test:job:unique-child", "u1", ""},
				{"test:job:child", "keyed", "k1"},
			} {
				var id string
				var err error
				if d.report == "c2" {
					// The typed handle's dispatch from a job is the same.
					id, err = typed.DispatchFrom(ctx, jc, exportInput{Report: d.report}, nil)
				} else {
					id, err = jc.Dispatch(ctx, d.job, exportInput{Report: d.report}, &jobs.DispatchOptions{Key: d.key})
				}
				a.ids, a.errs = append(a.ids, id), append(a.errs, err)
			}
			mu.Lock()
			attempts = append(attempts, a)
			mu.Unlock()
			if jc.Retry > 0 {
				return nil
			}
			// The first attempt fails once its children have finished.
			for range 4 {
				select {
				case <-childDone:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return errors.New("the parent fails after dispatching")
		})
	})
	r := b.runner(t, nil)
	parentID, err := r.Client().Dispatch(context.Background(), "test:job:parent", exportInput{Report: "p"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)

	eventually(t, "the parent's retry", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == 2
	})
	drained(t, r.Inspector())
	require.Equal(t, 4, b.count(t, `SELECT count(*) FROM runs`), "every child ran once")
	for _, ref := range []string{"c1", "c2", "u1", "keyed"} {
		require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE ref = $1 AND tenant_id = 'acme' AND info = $2`, ref, parentID), ref)
	}
	mu.Lock()
	defer mu.Unlock()
	first, retry := attempts[0], attempts[1]
	for i := range first.errs {
		require.NoError(t, first.errs[i])
	}
	require.Equal(t, first.ids, retry.ids, "a retry derives the same task ids")
	require.NotEqual(t, first.ids[0], first.ids[1], "two dispatches of one job in one run are two children")
	require.NoError(t, retry.errs[0], "a child the run already dispatched is not an error")
	require.NoError(t, retry.errs[1])
	require.NoError(t, retry.errs[2])
	require.NoError(t, retry.errs[3], "a keyed child the run's earlier attempt dispatched is not an error either")
}

// TestContextDispatchNewRunOfKeyedParentDispatchesAgain: a keyed parent
// dispatched again after its dedup window is a new run under the same task
// id; its children are new runs too, although the earlier run's child is
// still kept (archived, for 90 days, or finished after its parent and so
// retained longer). Only the retries of one run share their children.
func TestContextDispatchNewRunOfKeyedParentDispatchesAgain(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		errs []error
	)
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "child", &jobs.Options{MaxRetries: -1}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			if err := insertRun(ctx, jc, jc.Job, in.Report, jc.TaskID); err != nil {
				return err
			}
			return errors.New("the child fails and is archived")
		})
		jobs.Manual[exportInput](b.f, "parent", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			_, err := jc.Dispatch(ctx, "test:job:child", exportInput{Report: in.Report}, nil)
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
			return err
		})
	})
	r := b.runner(t, nil)
	ctx := context.Background()
	opts := &jobs.DispatchOptions{TenantID: "acme", Key: "nightly"}
	parentID, err := r.Client().Dispatch(ctx, "test:job:parent", exportInput{Report: "first"}, opts)
	require.NoError(t, err)
	drained(t, r.Inspector())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'first'`))

	// The parent's dedup window ends (asynq drops its retained run); the
	// archived child stays.
	parent, err := r.Inspector().Get(ctx, "", parentID)
	require.NoError(t, err)
	require.NoError(t, asynq.NewInspectorFromRedisClient(b.rdb).DeleteTask(parent.Queue, parentID))

	again, err := r.Client().Dispatch(ctx, "test:job:parent", exportInput{Report: "second"}, opts)
	require.NoError(t, err, "the key's window has passed: a new run")
	require.Equal(t, parentID, again)
	eventually(t, "the second parent run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(errs) == 2
	})
	drained(t, r.Inspector())
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'second'`), "the new run's child ran")
}

// TestContextDispatchKeyedChildOfRetriedParent: a parent that dispatches a
// child with a Key and then fails is retried; the retry's dispatch of the
// same key finds the child its earlier attempt dispatched and returns its
// id and no error, so the retry can succeed, and the child runs once. The
// same key dispatched by another run (another parent, a direct dispatch)
// is still ErrDuplicate.
func TestContextDispatchKeyedChildOfRetriedParent(t *testing.T) {
	t.Parallel()
	type result struct {
		retry int
		id    string
		err   error
	}
	var (
		mu      sync.Mutex
		results []result
	)
	fast := &jobs.Options{MaxRetries: 2, Backoff: func(int) time.Duration { return 10 * time.Millisecond }}
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "child", nil, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			return insertRun(ctx, jc, jc.Job, in.Report, jc.CausationID)
		})
		jobs.Manual[exportInput](b.f, "parent", fast, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			id, err := jc.Dispatch(ctx, "test:job:child", exportInput{Report: in.Report}, &jobs.DispatchOptions{Key: "ship:" + in.Report})
			mu.Lock()
			results = append(results, result{jc.Retry, id, err})
			mu.Unlock()
			if err != nil {
				return err
			}
			if jc.Retry == 0 && in.Report == "p1" {
				return errors.New("the parent fails after dispatching")
			}
			return nil
		})
	})
	r := b.runner(t, nil)
	ctx := context.Background()
	p1, err := r.Client().Dispatch(ctx, "test:job:parent", exportInput{Report: "p1"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	eventually(t, "the parent's retry", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) >= 2
	})
	drained(t, r.Inspector())
	archived, err := r.Inspector().List(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, archived, "the retried parent succeeded")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'p1' AND info = $1`, p1), "the child ran once")
	mu.Lock()
	require.Len(t, results, 2)
	require.NoError(t, results[0].err)
	require.Equal(t, 1, results[1].retry)
	require.NoError(t, results[1].err, "the earlier attempt of the same run dispatched the child")
	require.Equal(t, results[0].id, results[1].id)
	mu.Unlock()

	// Another parent run dispatching the same key is a duplicate, as is a
	// direct dispatch of it.
	_, err = r.Client().Dispatch(ctx, "test:job:child", exportInput{Report: "p1"}, &jobs.DispatchOptions{TenantID: "acme", Key: "ship:p1"})
	require.ErrorIs(t, err, jobs.ErrDuplicate)
	_, err = r.Client().Dispatch(ctx, "test:job:parent", exportInput{Report: "p1"}, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	eventually(t, "the second parent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) >= 3
	})
	drained(t, r.Inspector())
	mu.Lock()
	defer mu.Unlock()
	require.ErrorIs(t, results[2].err, jobs.ErrDuplicate, "another run's dispatch of the key")
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM runs WHERE ref = 'p1'`))
}
