package dispatcher_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

type noted struct {
	N int `json:"n"`
}

// bundle is a test's database, registry, runtime and event type.
type bundle struct {
	db    *kumikotest.DB
	reg   *framework.Registry
	f     *framework.Feature
	noted framework.EventType[noted]
	rt    *framework.Runtime
}

func setup(t *testing.T, register func(b *bundle)) *bundle {
	t.Helper()
	b := &bundle{db: kumikotest.NewDB(t), reg: framework.NewRegistry()}
	b.f = b.reg.Feature("test")
	b.noted = framework.DefineEvent[noted](b.f, "noted", nil)
	_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE seen (tenant_id text NOT NULL, consumer text, position bigint, n int, causation text, correlation text);
		SELECT kumiko_enable_tenancy('seen')`)
	require.NoError(t, err)
	if register != nil {
		register(b)
	}
	b.rt, err = framework.NewRuntime(b.reg, b.db.Pool, nil)
	require.NoError(t, err)
	return b
}

// write appends n events for tenant in streams s0..s(streams-1).
func (b *bundle) write(t *testing.T, tenant string, from, n, streams int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		_, err := b.rt.InTx(context.Background(), tenant, framework.Metadata{CorrelationID: fmt.Sprintf("corr-%d", i)}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: fmt.Sprint(i % streams)}, framework.AnyVersion, b.noted.With(noted{N: i}))
		})
		require.NoError(t, err)
	}
}

// recorder is a projection that writes every event to the seen table.
func recorder(b *bundle, name string, opts *framework.ProjectionOptions) *framework.Projection {
	p := framework.MultiStreamProjection(b.f, name, opts)
	framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, $2, $3, $4, $5, $6)`, tx.TenantID(), name, e.ID, e.Payload.N, tx.CausationID(), tx.CorrelationID())
		return err
	})
	return p
}

func newDispatcher(t *testing.T, b *bundle, cfg *dispatcher.Config) *dispatcher.Dispatcher {
	t.Helper()
	if cfg == nil {
		cfg = &dispatcher.Config{}
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = "test-instance"
	}
	d, err := dispatcher.New(b.db.Pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), cfg)
	require.NoError(t, err)
	require.False(t, d.Registered(), "registered before Register")
	require.NoError(t, d.Register(context.Background()))
	require.True(t, d.Registered(), "not registered after Register")
	return d
}

// drain runs passes until the consumer has delivered want events in total.
func drain(t *testing.T, d *dispatcher.Dispatcher, name string, want int) {
	t.Helper()
	got := 0
	deadline := time.Now().Add(30 * time.Second)
	for got < want {
		n, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		got += n
		if n == 0 {
			require.True(t, time.Now().Before(deadline), "delivered %d of %d", got, want)
			time.Sleep(5 * time.Millisecond)
		}
	}
	require.Equal(t, want, got)
}

func count(t *testing.T, b *bundle, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

type consumerRow struct {
	status   string
	attempts int
	position int64
	lastErr  *string
}

func state(t *testing.T, b *bundle, name, instance string) consumerRow {
	t.Helper()
	var r consumerRow
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT status, attempts, cursor_position, last_error FROM event_consumers WHERE name = $1 AND instance_id = $2`, name, instance).
		Scan(&r.status, &r.attempts, &r.position, &r.lastErr))
	return r
}

func TestEveryEventDeliveredInOrderToEveryConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "a", nil)
		recorder(b, "b", &framework.ProjectionOptions{BatchSize: 7})
	})
	d := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 30, 4)
	b.write(t, "t2", 30, 20, 3)
	drain(t, d, "test:a", 50)
	drain(t, d, "test:b", 50)
	for _, name := range []string{"test:a", "test:b"} {
		rows, err := b.db.Pool.Query(context.Background(), `SELECT n FROM seen WHERE consumer = $1 ORDER BY ctid`, name[len("test:"):])
		require.NoError(t, err)
		var ns []int
		for rows.Next() {
			var n int
			require.NoError(t, rows.Scan(&n))
			ns = append(ns, n)
		}
		require.Len(t, ns, 50)
		for i, n := range ns {
			require.Equal(t, i, n, "order")
		}
	}
	// Events keep their tenant and carry correlation and causation ids.
	require.Equal(t, 30, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'a' AND tenant_id = 't1'`))
	require.Equal(t, 50, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'a' AND causation = position::text AND correlation = 'corr-' || n`))
}

func TestIdlePassWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 3, 1)
	drain(t, d, "test:a", 3)
	var before string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT xmin::text FROM event_consumers WHERE name = 'test:a'`).Scan(&before))
	for range 5 {
		n, err := d.RunOnce(context.Background(), "test:a")
		require.NoError(t, err)
		require.Zero(t, n)
	}
	var after string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT xmin::text FROM event_consumers WHERE name = 'test:a'`).Scan(&after))
	require.Equal(t, before, after, "an idle pass must not write the state row")
}

func TestCursorMovesOnlyPastSuccesses(t *testing.T) {
	t.Parallel()
	var failAt atomic.Int64
	failAt.Store(5)
	b := setup(t, func(b *bundle) {
		p := recorder(b, "a", nil)
		_ = p
		q := framework.MultiStreamProjection(b.f, "flaky", nil)
		framework.On(q, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'flaky', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N); err != nil {
				return err
			}
			if int64(e.Payload.N) == failAt.Load() {
				return errors.New("boom")
			}
			return nil
		})
	})
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond})
	b.write(t, "t1", 0, 10, 2)
	// All visible, so that the pass reaches the failing event.
	b.db.WaitVisible(t)
	drain(t, d, "test:flaky", 5) // events 0..4 commit with the cursor
	require.Equal(t, 5, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'flaky'`), "the failing event's write is undone")
	st := state(t, b, "test:flaky", dispatcher.SharedInstance)
	require.Equal(t, 1, st.attempts)
	require.NotNil(t, st.lastErr)
	require.Contains(t, *st.lastErr, "boom")
	// The other consumer is unaffected.
	drain(t, d, "test:a", 10)
	// Once the failure clears, delivery continues from the failing event.
	failAt.Store(-1)
	time.Sleep(5 * time.Millisecond)
	drain(t, d, "test:flaky", 5)
	require.Equal(t, 10, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'flaky'`))
	require.Equal(t, 10, count(t, b, `SELECT count(DISTINCT n) FROM seen WHERE consumer = 'flaky'`))
	require.Zero(t, state(t, b, "test:flaky", dispatcher.SharedInstance).attempts)
}

func TestThrowingConsumerDiesAloneAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "healthy", nil)
		q := framework.MultiStreamProjection(b.f, "broken", &framework.ProjectionOptions{MaxAttempts: 3})
		framework.On(q, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			return errors.New("always")
		})
	})
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, RetryMaxDelay: 2 * time.Millisecond})
	b.write(t, "t1", 0, 4, 1)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && state(t, b, "test:broken", dispatcher.SharedInstance).status != "dead" {
		_, err := d.RunOnce(context.Background(), "test:broken")
		require.NoError(t, err)
		time.Sleep(3 * time.Millisecond)
	}
	st := state(t, b, "test:broken", dispatcher.SharedInstance)
	require.Equal(t, "dead", st.status)
	require.Equal(t, 3, st.attempts)
	require.Zero(t, st.position)
	// Dead: no more passes run.
	n, err := d.RunOnce(context.Background(), "test:broken")
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 3, state(t, b, "test:broken", dispatcher.SharedInstance).attempts)
	drain(t, d, "test:healthy", 4)
}

// A handler that panics fails its event like an error, with the stack
// logged: the panic does not escape the pass (in Run it would end the
// process, all its consumers and, all-in-one, its API; and the restarted
// process would panic on the same event again), the events before it
// commit, and the attempt counts, so the consumer turns dead.
func TestPanickingHandlerFailsItsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "healthy", nil)
		p := framework.MultiStreamProjection(b.f, "panicky", &framework.ProjectionOptions{MaxAttempts: 1})
		framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if e.Payload.N == 2 {
				var m map[string]int
				//lint:ignore SA5000 the handler panics on purpose
				m["x"] = 1 // panics: assignment to entry in nil map
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'panicky', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
	})
	var logs bytes.Buffer
	d := newDispatcher(t, b, &dispatcher.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	b.write(t, "t1", 0, 4, 1)
	b.db.WaitVisible(t)

	var n int
	var err error
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		n, err = d.RunOnce(context.Background(), "test:panicky")
	}()
	require.Nil(t, recovered, "the panic escaped the pass")
	require.NoError(t, err)
	require.Equal(t, 2, n, "events 0 and 1 commit")
	st := state(t, b, "test:panicky", dispatcher.SharedInstance)
	require.Equal(t, "dead", st.status)
	require.Equal(t, 1, st.attempts)
	require.NotNil(t, st.lastErr)
	require.Contains(t, *st.lastErr, "panic: assignment to entry in nil map")
	require.Equal(t, 2, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'panicky'`))
	require.Contains(t, logs.String(), "TestPanickingHandlerFailsItsEvent", "the log has the panic's stack")
	drain(t, d, "test:healthy", 4)
}

// A batch whose handlers together outlast PassTimeout, each of them fast
// enough alone, commits in parts: the pass commits the events handled
// before the deadline, counting no attempt against the event whose
// handler the deadline cut short, and the next pass goes on from it.
// (Before, the re-run that commits those events ran on the expired
// context: nothing ever committed, and no attempt was ever counted.) An
// event whose handler alone outlasts PassTimeout fails like an error.
func TestBatchOutlastingPassTimeoutCommitsInParts(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		slow := framework.MultiStreamProjection(b.f, "slow", &framework.ProjectionOptions{MaxAttempts: 1})
		framework.On(slow, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			time.Sleep(25 * time.Millisecond)
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'slow', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
		stuck := framework.MultiStreamProjection(b.f, "stuck", &framework.ProjectionOptions{MaxAttempts: 2})
		framework.On(stuck, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if e.Payload.N == 5 {
				<-ctx.Done() // never finishes within the pass
				return ctx.Err()
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'stuck', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
	})
	// A consumer whose handler sends no statement (in-memory state, such as
	// the SSE hub) never sees the deadline: the pass stops before the next
	// event, and the cursor advance commits all the same.
	memory := dispatcher.Consumer{Name: "test:memory", System: true, MaxAttempts: 1,
		Apply: func(ctx context.Context, tx *framework.Tx, env framework.Envelope) error {
			time.Sleep(25 * time.Millisecond)
			return nil
		}}
	d, err := dispatcher.New(b.db.Pool, b.reg, append(dispatcher.ProjectionConsumers(b.reg, nil), memory),
		&dispatcher.Config{InstanceID: "test-instance", PassTimeout: 250 * time.Millisecond, RetryBaseDelay: time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	b.write(t, "t1", 0, 20, 1)
	b.db.WaitVisible(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitCount(t, b, `SELECT count(*) FROM seen WHERE consumer = 'slow'`, 20, 15*time.Second)
	require.Equal(t, 20, count(t, b, `SELECT count(DISTINCT n) FROM seen WHERE consumer = 'slow'`))
	st := state(t, b, "test:slow", dispatcher.SharedInstance)
	require.Equal(t, "idle", st.status)
	require.Zero(t, st.attempts, "an attempt counted against an event the deadline cut short")

	waitCount(t, b, `SELECT count(*) FROM event_consumers WHERE name = 'test:memory' AND cursor_position = (SELECT max(position) FROM events)`, 1, 15*time.Second)
	st = state(t, b, "test:memory", dispatcher.SharedInstance)
	require.Equal(t, "idle", st.status)
	require.Zero(t, st.attempts)

	waitCount(t, b, `SELECT count(*) FROM event_consumers WHERE name = 'test:stuck' AND status = 'dead'`, 1, 15*time.Second)
	st = state(t, b, "test:stuck", dispatcher.SharedInstance)
	require.Equal(t, 2, st.attempts)
	require.NotNil(t, st.lastErr)
	require.Contains(t, *st.lastErr, "outlasted the pass timeout")
	require.Equal(t, 5, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'stuck'`), "events 0 to 4 commit")
}

func TestSkipApplyErrorsRecordsDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		q := framework.MultiStreamProjection(b.f, "lenient", &framework.ProjectionOptions{SkipApplyErrors: true})
		framework.On(q, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'lenient', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N); err != nil {
				return err
			}
			if e.Payload.N == 2 {
				return errors.New("poison")
			}
			return nil
		})
	})
	d := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 5, 1)
	drain(t, d, "test:lenient", 4)
	require.Equal(t, 4, count(t, b, `SELECT count(*) FROM seen`))
	require.Zero(t, count(t, b, `SELECT count(*) FROM seen WHERE n = 2`))
	require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = 'test:lenient' AND error LIKE '%poison%'`))
	require.Equal(t, "idle", state(t, b, "test:lenient", dispatcher.SharedInstance).status)
}

func TestSagaKeepsCorrelationAndChainsCausation(t *testing.T) {
	t.Parallel()
	type hop struct {
		Depth int `json:"depth"`
	}
	var hopEv framework.EventType[hop]
	b := setup(t, func(b *bundle) {
		hopEv = framework.DefineEvent[hop](b.f, "hop", nil)
		p := framework.MultiStreamProjection(b.f, "saga", &framework.ProjectionOptions{Saga: true})
		framework.On(p, hopEv, func(ctx context.Context, tx *framework.Tx, e framework.Event[hop]) error {
			if e.Payload.Depth >= 3 {
				return nil
			}
			return tx.Append(framework.Stream{Type: "hop", ID: fmt.Sprint(e.Payload.Depth + 1)}, framework.NoStream, hopEv.With(hop{Depth: e.Payload.Depth + 1}))
		})
	})
	d := newDispatcher(t, b, nil)
	_, err := b.rt.InTx(context.Background(), "t7", framework.Metadata{CorrelationID: "corr-x", CausationID: "req-1", RequestID: "req-1"}, func(ctx context.Context, tx *framework.Tx) error {
		return tx.Append(framework.Stream{Type: "hop", ID: "0"}, framework.NoStream, hopEv.With(hop{Depth: 0}))
	})
	require.NoError(t, err)
	drain(t, d, "test:saga", 4)
	rows, err := b.db.Pool.Query(context.Background(), `SELECT position, tenant_id, metadata->>'correlationId', metadata->>'causationId' FROM events ORDER BY position`)
	require.NoError(t, err)
	var prev int64
	i := 0
	for rows.Next() {
		var pos int64
		var tenant, corr, cause string
		require.NoError(t, rows.Scan(&pos, &tenant, &corr, &cause))
		require.Equal(t, "t7", tenant, "events keep their tenant through a saga")
		require.Equal(t, "corr-x", corr)
		if i == 0 {
			require.Equal(t, "req-1", cause)
		} else {
			require.Equal(t, fmt.Sprint(prev), cause, "causation chains to the previous hop")
		}
		prev = pos
		i++
	}
	require.Equal(t, 4, i)
}

// gapTracer runs hook once, after the first ROLLBACK that ends once it is
// armed: in a pass whose event failed, the gap between the rolled-back
// attempt and its re-run, while the consumer's advisory lock is free.
type gapTracer struct {
	armed atomic.Bool
	hook  func()
}

type rollbackKey struct{}

func (g *gapTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == "ROLLBACK" {
		return context.WithValue(ctx, rollbackKey{}, true)
	}
	return ctx
}

func (g *gapTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(rollbackKey{}) != nil && g.armed.CompareAndSwap(true, false) {
		g.hook()
	}
}

// When another process's pass commits between a failed attempt and its
// re-run (the lock is free in between), the re-run sees another batch: it
// must neither apply it nor blame the failure on an event of it. Here
// process A's pass fails at event 2 (flaky: it fails once), B delivers
// events 0 to 2 in the gap, and A's re-run would otherwise apply 3 and 4
// and record the failure against event 5, which never ran: a dead letter
// for a healthy event (lost) with SkipApplyErrors, an attempt against it
// without. A records nothing, and every event is applied once.
func TestRerunRecordsNothingWhenAnotherPassMovedTheCursor(t *testing.T) {
	t.Parallel()
	for _, lenient := range []bool{true, false} {
		t.Run(fmt.Sprintf("SkipApplyErrors=%t", lenient), func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			b := setup(t, func(b *bundle) {
				p := framework.MultiStreamProjection(b.f, "gap", &framework.ProjectionOptions{SkipApplyErrors: lenient})
				framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
					if e.Payload.N == 2 && calls.Add(1) == 1 {
						return errors.New("flaky")
					}
					_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'gap', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
					return err
				})
			})
			consumers := dispatcher.ProjectionConsumers(b.reg, nil)
			other, err := dispatcher.New(b.db.Pool, b.reg, consumers, &dispatcher.Config{InstanceID: "other", BatchSize: 3})
			require.NoError(t, err)
			var otherN int
			var otherErr error
			tr := &gapTracer{hook: func() { otherN, otherErr = other.RunOnce(context.Background(), "test:gap") }}
			cfg, err := pgxpool.ParseConfig(b.db.URL)
			require.NoError(t, err)
			cfg.ConnConfig.Tracer = tr
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			d, err := dispatcher.New(pool, b.reg, consumers, &dispatcher.Config{InstanceID: "test-instance", BatchSize: 10, RetryBaseDelay: time.Millisecond})
			require.NoError(t, err)
			require.NoError(t, d.Register(context.Background()))
			b.write(t, "t1", 0, 10, 1)
			b.db.WaitVisible(t)

			tr.armed.Store(true)
			n, err := d.RunOnce(context.Background(), "test:gap")
			require.NoError(t, err)
			require.Zero(t, n, "the re-run applied a batch that did not fail")
			require.False(t, tr.armed.Load(), "the other process did not run in the gap")
			require.NoError(t, otherErr)
			require.Equal(t, 3, otherN, "the other process delivers events 0 to 2 in the gap")
			st := state(t, b, "test:gap", dispatcher.SharedInstance)
			require.Equal(t, 0, st.attempts, "a failure recorded against an event that did not fail")
			require.Nil(t, st.lastErr)
			require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters`), "a healthy event dead-lettered")

			drain(t, d, "test:gap", 7)
			require.Equal(t, 10, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'gap'`))
			require.Equal(t, 10, count(t, b, `SELECT count(DISTINCT n) FROM seen WHERE consumer = 'gap'`))
		})
	}
}

// Run keeps retrying the registration while it fails (here: the database
// is not migrated yet, its consumer table missing), and once it succeeds
// the dispatcher registers and delivers.
func TestRunRetriesRegistration(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d, err := dispatcher.New(b.db.Pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), &dispatcher.Config{InstanceID: "late", PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(context.Background(), `ALTER TABLE event_consumers RENAME TO event_consumers_later`)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	stopped := make(chan struct{})
	go func() { runErr = d.Run(ctx); close(stopped) }()
	defer func() { cancel(); <-stopped; require.NoError(t, runErr) }()

	time.Sleep(500 * time.Millisecond) // a few failed attempts
	select {
	case <-stopped:
		t.Fatalf("Run returned while registration failed: %v", runErr)
	default:
	}
	require.False(t, d.Registered())
	_, err = b.db.Pool.Exec(context.Background(), `ALTER TABLE event_consumers_later RENAME TO event_consumers`)
	require.NoError(t, err)
	b.write(t, "t1", 0, 1, 1)
	waitCount(t, b, `SELECT count(*) FROM seen`, 1, 20*time.Second)
	require.True(t, d.Registered())
}

func TestSharedInstanceIDRefused(t *testing.T) {
	t.Parallel()
	_, err := dispatcher.New(nil, framework.NewRegistry(), nil, &dispatcher.Config{InstanceID: dispatcher.SharedInstance})
	require.ErrorIs(t, err, dispatcher.ErrReservedInstance)
}

// Run delivers through LISTEN/NOTIFY with the poll interval at a minute,
// also after the listening backend was killed.
//
// The waits are long: a parallel test (this package's horizon test, or any
// test of another package holding an xid) can hold the cluster-wide
// horizon, and so this test's events, back for seconds. They stay far
// below the poll interval (at least 48 s with jitter), so only a NOTIFY
// can deliver in time.
func TestListenDeliversWithoutPolling(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	// The writer process is another dispatcher instance: its Wake sends the
	// NOTIFY that the reader's LISTEN connection receives.
	reader := newDispatcher(t, b, &dispatcher.Config{InstanceID: "reader", PollInterval: time.Minute})
	writer, err := dispatcher.New(b.db.Pool, b.reg, nil, &dispatcher.Config{InstanceID: "writer", PollInterval: time.Minute})
	require.NoError(t, err)
	b.rt.OnCommit(func(int) { writer.Wake() })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = reader.Run(ctx) })
	wg.Go(func() { _ = writer.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitListening(t, b, 2)
	time.Sleep(50 * time.Millisecond) // let the first pass finish
	b.write(t, "t1", 0, 1, 1)
	waitCount(t, b, `SELECT count(*) FROM seen`, 1, 20*time.Second)

	// Kill the LISTEN backend; the dispatcher reconnects and delivers again.
	_, err = b.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`)
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond)
	waitListening(t, b, 2)
	time.Sleep(50 * time.Millisecond)
	b.write(t, "t1", 1, 1, 1)
	waitCount(t, b, `SELECT count(*) FROM seen`, 2, 20*time.Second)
}

// The LISTEN connection's reconnect backoff starts over after a connection
// that listened: killed seven times, it comes back quickly each time (a
// backoff that kept doubling would wait 11 s in all, 5 s for the last).
func TestListenReconnectsQuicklyEachTime(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	d, err := dispatcher.New(b.db.Pool, b.reg, nil, &dispatcher.Config{InstanceID: "relisten", PollInterval: time.Minute})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	const listenerSQL = `SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`
	waitListening(t, b, 1)
	var total time.Duration
	for range 7 {
		old := count(t, b, listenerSQL)
		start := time.Now()
		_, err := b.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, old)
		require.NoError(t, err)
		for {
			if pid := count(t, b, listenerSQL); pid != 0 && pid != old {
				break
			}
			require.Less(t, time.Since(start), 20*time.Second, "no new LISTEN connection")
			time.Sleep(10 * time.Millisecond)
		}
		total += time.Since(start)
	}
	require.Less(t, total, 5*time.Second, "reconnects took %s in all", total)
}

// An event that a NOTIFY announces while an older transaction holds the
// horizon back is delivered soon after that transaction ends, even with
// a poll interval of a minute: its end wakes nobody, so the dispatcher
// re-polls, and that re-poll is capped well below the poll interval.
func TestInvisibleEventDeliveredSoonAfterHorizonMoves(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d := newDispatcher(t, b, &dispatcher.Config{PollInterval: time.Minute})
	b.rt.OnCommit(func(int) { d.Wake() })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	waitListening(t, b, 1)

	// An open transaction with an xid: the write's event stays above the
	// horizon until it ends.
	holder, err := b.db.Pool.Begin(context.Background())
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(context.Background(), `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	b.write(t, "t1", 0, 1, 1)
	// Long enough for an uncapped doubling re-poll to reach seconds.
	time.Sleep(4500 * time.Millisecond)
	require.Zero(t, count(t, b, `SELECT count(*) FROM seen`), "delivered above the horizon")
	require.NoError(t, holder.Rollback(context.Background()))
	start := time.Now()
	waitCount(t, b, `SELECT count(*) FROM seen`, 1, 10*time.Second)
	// Other packages' transactions may hold the horizon a little longer.
	require.Less(t, time.Since(start), 1500*time.Millisecond, "delivered too late after the horizon moved")
}

func waitListening(t *testing.T, b *bundle, n int) {
	t.Helper()
	waitCount(t, b, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'`, n, 10*time.Second)
}

func waitCount(t *testing.T, b *bundle, sql string, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := count(t, b, sql)
		if got == want {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s: got %d, want %d", sql, got, want)
		time.Sleep(10 * time.Millisecond)
	}
}

// A handler failure is logged with what ties it to its cause: the event's
// type, tenant, correlation id and causation id (a write's request id),
// so that an operator finds the request whose event a consumer choked on,
// as the job runner's logs already do. Before, "consumer event failed" and
// "consumer dead" named only the consumer and the position.
func TestFailureLogCarriesTheEventsIDs(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		q := framework.MultiStreamProjection(b.f, "broken", &framework.ProjectionOptions{MaxAttempts: 1})
		framework.On(q, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			return errors.New("always")
		})
	})
	logs := &proctest.Buffer{}
	d := newDispatcher(t, b, &dispatcher.Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	_, err := b.rt.InTx(context.Background(), "t9", framework.Metadata{CorrelationID: "corr-log", CausationID: "req-log", RequestID: "req-log"}, func(ctx context.Context, tx *framework.Tx) error {
		return tx.Append(framework.Stream{Type: "s", ID: "1"}, framework.AnyVersion, b.noted.With(noted{N: 1}))
	})
	require.NoError(t, err)
	b.db.WaitVisible(t)
	_, err = d.RunOnce(context.Background(), "test:broken")
	require.NoError(t, err)
	require.Equal(t, "dead", state(t, b, "test:broken", dispatcher.SharedInstance).status)

	lines := map[string]map[string]any{}
	for line := range strings.Lines(logs.String()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		lines[rec["msg"].(string)] = rec
	}
	for _, msg := range []string{"consumer event failed", "consumer dead"} {
		rec, ok := lines[msg]
		require.True(t, ok, "no %q line in %s", msg, logs.String())
		require.Equal(t, "corr-log", rec["correlation_id"], msg)
		require.Equal(t, "req-log", rec["causation_id"], msg)
		require.Equal(t, "t9", rec["tenant_id"], msg)
		require.Equal(t, "test:event:noted", rec["event_type"], msg)
	}
}
