package rebuild_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/features/users"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/rebuild"
)

type counted struct {
	Key string `json:"key" validate:"required"`
	N   int    `json:"n"`
}

// bundle is a test's database, registry and runtime: the sample features
// plus a "test" feature with the tally projection (table tally) and a few
// projections that must not be rebuilt.
type bundle struct {
	db      *kumikotest.DB
	reg     *framework.Registry
	counted framework.EventType[counted]
	rt      *framework.Runtime
	// failAt makes the tally handler fail on the event whose N equals it.
	failAt atomic.Int64
	// appendAt makes the sneaky handler append on N equal to it.
	appendAt atomic.Int64
	// foreignAt makes the sneaky handler write another table on N equal to it.
	foreignAt atomic.Int64
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return setupOn(t, kumikotest.NewDB(t), 0)
}

// setupOn is setup on db, with the tally projection in partitions
// partitions; the tables are created when db has none yet.
func setupOn(t *testing.T, db *kumikotest.DB, partitions int) *bundle {
	t.Helper()
	b := &bundle{db: db, reg: framework.NewRegistry()}
	b.failAt.Store(-1)
	b.appendAt.Store(-1)
	b.foreignAt.Store(-1)
	orders.Register(b.reg)
	users.Register(b.reg)
	f := b.reg.Feature("test")
	b.counted = framework.DefineEvent[counted](f, "counted", nil)
	var exists bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT to_regclass('tally') IS NOT NULL`).Scan(&exists))
	var err error
	if !exists {
		_, err = b.db.Pool.Exec(context.Background(), `
		CREATE TABLE tally (tenant_id text NOT NULL, key text NOT NULL, total bigint NOT NULL, n int NOT NULL DEFAULT 0,
		  PRIMARY KEY (tenant_id, key));
		SELECT kumiko_enable_tenancy('tally');
		CREATE TABLE sneaky (tenant_id text NOT NULL, n int NOT NULL);
		SELECT kumiko_enable_tenancy('sneaky');
		CREATE TABLE elsewhere (tenant_id text NOT NULL, n int NOT NULL);
		SELECT kumiko_enable_tenancy('elsewhere')`)
		require.NoError(t, err)
	}

	tally := framework.MultiStreamProjection(f, "tally", &framework.ProjectionOptions{Table: "tally", MaxAttempts: 2, Partitions: partitions})
	framework.On(tally, b.counted, func(ctx context.Context, tx *framework.Tx, e framework.Event[counted]) error {
		if int64(e.Payload.N) == b.failAt.Load() {
			return fmt.Errorf("tally cannot count %d", e.Payload.N)
		}
		_, err := tx.Exec(ctx, `INSERT INTO tally AS t (tenant_id, key, total, n) VALUES ($1, $2, $3, 1)
			ON CONFLICT (tenant_id, key) DO UPDATE SET total = t.total + EXCLUDED.total, n = t.n + 1`, e.TenantID, e.Payload.Key, e.Payload.N)
		return err
	})
	sneaky := framework.MultiStreamProjection(f, "sneaky", &framework.ProjectionOptions{Table: "sneaky"})
	framework.On(sneaky, b.counted, func(ctx context.Context, tx *framework.Tx, e framework.Event[counted]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO sneaky VALUES ($1, $2)`, e.TenantID, e.Payload.N); err != nil {
			return err
		}
		if int64(e.Payload.N) == b.foreignAt.Load() {
			if _, err := tx.Exec(ctx, `INSERT INTO elsewhere VALUES ($1, $2)`, e.TenantID, e.Payload.N); err != nil {
				return err
			}
		}
		if int64(e.Payload.N) == b.appendAt.Load() {
			return tx.Append(framework.Stream{Type: "echo", ID: e.Payload.Key}, framework.AnyVersion, b.counted.With(counted{Key: "echo", N: -1}))
		}
		return nil
	})
	saga := framework.MultiStreamProjection(f, "saga", &framework.ProjectionOptions{Table: "saga_log", Saga: true})
	framework.On(saga, b.counted, func(context.Context, *framework.Tx, framework.Event[counted]) error { return nil })
	each := framework.MultiStreamProjection(f, "each", &framework.ProjectionOptions{Table: "each_log", Delivery: framework.DeliveryPerInstance})
	framework.On(each, b.counted, func(context.Context, *framework.Tx, framework.Event[counted]) error { return nil })
	ghost := framework.MultiStreamProjection(f, "ghost", &framework.ProjectionOptions{Table: "ghost"})
	framework.On(ghost, b.counted, func(context.Context, *framework.Tx, framework.Event[counted]) error { return nil })
	inline := framework.InlineProjection(f, "inline")
	framework.On(inline, b.counted, func(context.Context, *framework.Tx, framework.Event[counted]) error { return nil })

	b.rt, err = framework.NewRuntime(b.reg, b.db.Pool, nil)
	require.NoError(t, err)
	return b
}

// live returns a dispatcher for the tally projection alone (the "live"
// consumer), registered.
func (b *bundle) live(t *testing.T, names ...string) *dispatcher.Dispatcher {
	t.Helper()
	var cs []dispatcher.Consumer
	for _, n := range names {
		cs = append(cs, dispatcher.FromProjection(b.reg.Projection(n)))
	}
	d, err := dispatcher.New(b.db.Pool, b.reg, cs, &dispatcher.Config{InstanceID: "live", PollInterval: 10 * time.Millisecond, RetryBaseDelay: time.Millisecond, RetryMaxDelay: 5 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	return d
}

// count writes events counted{key, n} for n in [from, from+k) to tenant.
func (b *bundle) count(t *testing.T, tenant, key string, from, k int) {
	t.Helper()
	for n := from; n < from+k; n++ {
		_, err := b.rt.InTx(context.Background(), tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "c", ID: key}, framework.AnyVersion, b.counted.With(counted{Key: key, N: n}))
		})
		require.NoError(t, err)
	}
}

// runUntilDead runs passes of the live tally consumer until it is dead.
func (b *bundle) runUntilDead(t *testing.T, d *dispatcher.Dispatcher) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for b.int(t, `SELECT count(*) FROM event_consumers WHERE name = 'test:tally' AND status = 'dead'`) == 0 {
		require.True(t, time.Now().Before(deadline), "the live consumer never died")
		_, err := d.RunOnce(context.Background(), "test:tally")
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
}

func (b *bundle) int(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// drain runs passes of the consumer until nothing after its cursor is left.
func (b *bundle) drain(t *testing.T, d *dispatcher.Dispatcher, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		if b.lag(t, name) == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "%s did not catch up", name)
		time.Sleep(5 * time.Millisecond)
	}
}

// lag counts the events of the consumer's types after its cursor.
func (b *bundle) lag(t *testing.T, name string) int64 {
	t.Helper()
	return b.int(t, `SELECT count(*) FROM events e, event_consumers c
		WHERE c.name = $1 AND c.instance_id = '__shared__'
		  AND (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
		  AND (c.event_types IS NULL OR e.type = ANY(c.event_types))
		  AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index)`, name)
}

func (b *bundle) oid(t *testing.T, table string) int64 {
	t.Helper()
	return b.int(t, `SELECT coalesce(to_regclass($1)::oid::bigint, 0)`, table)
}

// tallyRows returns the tally table as "tenant/key=total/n" lines, and the
// same computed from the events table.
func (b *bundle) tallyRows(t *testing.T) (table, recount []string) {
	t.Helper()
	rows := func(sql string) []string {
		r, err := b.db.Pool.Query(context.Background(), sql)
		require.NoError(t, err)
		var out []string
		for r.Next() {
			var s string
			require.NoError(t, r.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, r.Err())
		return out
	}
	table = rows(`SELECT tenant_id || '/' || key || '=' || total || '/' || n FROM tally ORDER BY 1`)
	recount = rows(`SELECT tenant_id || '/' || (payload->>'key') || '=' || sum((payload->>'n')::bigint) || '/' || count(*)
		FROM events WHERE type = 'test:event:counted' GROUP BY tenant_id, payload->>'key' ORDER BY 1`)
	return table, recount
}

func TestRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for name, want := range map[string]error{
		"nope:nothing":             rebuild.ErrUnknownProjection,
		"users:send-welcome-email": rebuild.ErrNotRebuildable, // side-effect-only
		"test:saga":                rebuild.ErrNotRebuildable,
		"test:each":                rebuild.ErrNotRebuildable, // per-instance
		"test:inline":              rebuild.ErrNotRebuildable,
	} {
		_, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, name, nil)
		require.ErrorIs(t, err, want, name)
	}
	_, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "users:send-welcome-email", nil)
	require.ErrorContains(t, err, "side-effect-only")
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:saga", nil)
	require.ErrorContains(t, err, "saga")
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "nope:nothing", nil)
	require.ErrorContains(t, err, "orders:order-totals")
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:ghost", nil)
	require.ErrorContains(t, err, `table "ghost" does not exist`)
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{BatchSize: -1})
	require.ErrorContains(t, err, "rebuild: batch size -1 is negative")
	// A batch size no pass could hold (a typo, a script's overflow) is
	// refused before anything is built: it used to panic (or exhaust the
	// memory) preallocating the pass's slice, leaving the shadow schema.
	for _, size := range []int{10_001, 1 << 62} {
		_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{BatchSize: size})
		require.ErrorContains(t, err, fmt.Sprintf("rebuild: batch size %d is above the maximum of 10000", size))
	}
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers`))
}

// The main promise: a rebuild from position zero into a fresh table while
// writers keep appending, swapped in without losing or doubling an event.
func TestRebuildWhileWritersContinue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := b.live(t, "orders:order-totals")
	b.rt.OnCommit(func(int) { d.Wake() })
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = d.Run(ctx) })

	var written atomic.Int64
	writer := func(ctx context.Context, tenant string, seed uint64) error {
		rng := rand.New(rand.NewPCG(seed, seed))
		var placed []string
		for ctx.Err() == nil {
			call := framework.Call{Principal: framework.Principal{TenantID: tenant, UserID: "writer"}}
			if len(placed) > 0 && rng.IntN(4) == 0 {
				id := placed[rng.IntN(len(placed))]
				in, _ := json.Marshal(orders.CancelInput{OrderID: id, ExpectedVersion: 1})
				_, err := b.rt.Write(ctx, call, []framework.Command{{Type: "orders:write:cancel", Payload: in}})
				if err == nil {
					written.Add(1)
				}
				continue // a second cancel of the same order is a conflict
			}
			in, _ := json.Marshal(orders.PlaceInput{Customer: fmt.Sprintf("c%d", rng.IntN(5)), AmountCents: int64(rng.IntN(10000))})
			out, err := b.rt.Write(ctx, call, []framework.Command{{Type: "orders:write:place", Payload: in}})
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			placed = append(placed, out[0].(orders.WriteResult).ID)
			written.Add(1)
		}
		return nil
	}
	// History before the rebuild.
	wctx, stopWriters := context.WithCancel(ctx)
	errs := make(chan error, 2)
	var writers sync.WaitGroup
	writers.Go(func() { errs <- writer(wctx, "acme", 1) })
	writers.Go(func() { errs <- writer(wctx, "globex", 2) })
	for written.Load() < 600 {
		time.Sleep(10 * time.Millisecond)
	}
	// A bug corrupted the live table; the rebuild must not carry it over.
	deadline := time.Now().Add(30 * time.Second)
	for b.int(t, `SELECT coalesce(sum(events_processed), 0) FROM event_consumers WHERE name = 'orders:order-totals'`) < 600 {
		require.True(t, time.Now().Before(deadline))
		time.Sleep(10 * time.Millisecond)
	}
	// Under the live consumer's pass lock, like every writer of the table:
	// a live pass locks the rows of its batch's events in event order, this
	// UPDATE all rows in scan order, and the two deadlock without it.
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "orders:order-totals\x1f"+dispatcher.SharedInstance); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE order_totals SET orders = orders + 1000`)
		return err
	})
	require.NoError(t, err)
	oldOID := b.oid(t, "order_totals")

	before := written.Load()
	var passes atomic.Int64
	res, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "orders:order-totals", &rebuild.Config{
		BatchSize: 40,
		Progress:  func(rebuild.Progress) { passes.Add(1) },
	})
	require.NoError(t, err)
	during := written.Load() - before
	stopWritersAfter(t, &written, 100, stopWriters, &writers, errs)
	t.Logf("rebuild: %d events in %d passes, %s; %d writes during the rebuild", res.Events, passes.Load(), res.Duration, during)
	require.Positive(t, during, "writers must have run during the rebuild")
	require.GreaterOrEqual(t, res.Events, int64(600))
	require.Equal(t, `"public"."order_totals"`, res.Table)
	require.NotEqual(t, oldOID, b.oid(t, "order_totals"), "the table was swapped")
	require.False(t, res.Leftover)

	// The live consumer continues on the new table; once it has caught up,
	// the table equals a recount from the log.
	deadline = time.Now().Add(30 * time.Second)
	for b.lag(t, "orders:order-totals") > 0 {
		require.True(t, time.Now().Before(deadline), "live consumer did not catch up")
		time.Sleep(10 * time.Millisecond)
	}
	table := func(sql string) []string {
		rows, err := b.db.Pool.Query(ctx, sql)
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	got := table(`SELECT tenant_id || '/' || customer || '=' || orders || '/' || amount_cents FROM order_totals ORDER BY 1`)
	want := table(`SELECT p.tenant_id || '/' || (p.payload->>'customer') || '=' || (count(*) - count(c.position)) || '/' ||
			(sum((p.payload->>'amountCents')::bigint) - coalesce(sum((p.payload->>'amountCents')::bigint) FILTER (WHERE c.position IS NOT NULL), 0))
		FROM events p LEFT JOIN events c ON c.type = 'orders:event:cancelled'
		  AND c.tenant_id = p.tenant_id AND c.stream_type = p.stream_type AND c.stream_id = p.stream_id
		WHERE p.type = 'orders:event:placed'
		GROUP BY p.tenant_id, p.payload->>'customer' ORDER BY 1`)
	require.NotEmpty(t, want)
	require.Equal(t, want, got, "no event lost or applied twice")

	// Nothing of the rebuild is left; the new table is tenant-isolated.
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
	require.Equal(t, int64(2), b.int(t, `SELECT count(*) FROM pg_policies WHERE tablename = 'order_totals'`))
	out, err := b.rt.Query(ctx, framework.Call{Principal: framework.Principal{TenantID: "acme", UserID: "u"}}, framework.Command{Type: "orders:query:totals", Payload: json.RawMessage(`{}`)})
	require.NoError(t, err)
	var acme int64
	for _, tot := range out.([]orders.Total) {
		acme += tot.Orders
	}
	require.Equal(t, b.int(t, `SELECT sum(orders) FROM order_totals WHERE tenant_id = 'acme'`), acme, "a tenant sees only its rows")
}

func TestRebuildRemovesLeftoverOfInterruptedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:tally")
	b.count(t, "t1", "a", 0, 30)
	b.count(t, "t2", "b", 0, 20)
	b.drain(t, d, "test:tally")
	// What a rebuild killed mid-way leaves: its schema with a half-filled
	// table, and its consumer row (which pins retention).
	schema := rebuild.ShadowSchema("test:tally")
	_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %s; CREATE TABLE %s.tally (LIKE public.tally INCLUDING ALL);
		INSERT INTO %s.tally VALUES ('t1', 'a', 999, 1);
		INSERT INTO event_consumers (name, instance_id, cursor_commit_key, cursor_position) VALUES ('test:tally#rebuild', '__shared__', '0', 0)`, schema, schema, schema))
	require.NoError(t, err)

	res, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{BatchSize: 7})
	require.NoError(t, err)
	require.True(t, res.Leftover)
	require.Equal(t, int64(50), res.Events)
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table)
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema))

	// Abandon removes a leftover without rebuilding.
	_, err = b.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %s;
		INSERT INTO event_consumers (name, instance_id) VALUES ('test:tally#rebuild', '__shared__')`, schema))
	require.NoError(t, err)
	found, err := rebuild.Abandon(ctx, b.db.Pool, b.reg, "test:tally")
	require.NoError(t, err)
	require.True(t, found)
	found, err = rebuild.Abandon(ctx, b.db.Pool, b.reg, "test:tally")
	require.NoError(t, err)
	require.False(t, found)
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name = 'test:tally#rebuild'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema))
}

func TestOneRebuildAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('kumiko-rebuild' || chr(31) || 'test:tally', 0))`)
	require.NoError(t, err)
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", nil)
	require.ErrorIs(t, err, rebuild.ErrRunning)
	_, err = rebuild.Abandon(ctx, b.db.Pool, b.reg, "test:tally")
	require.ErrorIs(t, err, rebuild.ErrRunning)
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('kumiko-rebuild' || chr(31) || 'test:tally', 0))`)
	require.NoError(t, err)
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", nil)
	require.NoError(t, err)
}

// A handler failure during the replay abandons the rebuild: the shadow
// table and the temporary consumer go, the live table and cursor stay.
func TestFailedRebuildLeavesLiveUntouched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:tally")
	b.count(t, "t1", "a", 0, 20)
	b.drain(t, d, "test:tally")
	oid := b.oid(t, "tally")
	cursor := b.int(t, `SELECT cursor_position FROM event_consumers WHERE name = 'test:tally'`)

	b.failAt.Store(13)
	_, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{BatchSize: 5})
	require.ErrorContains(t, err, "tally cannot count 13")
	require.Equal(t, oid, b.oid(t, "tally"))
	require.Equal(t, cursor, b.int(t, `SELECT cursor_position FROM event_consumers WHERE name = 'test:tally'`))
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table)
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
}

// A cancelled rebuild (SIGINT in the CLI) cleans up after itself.
func TestCancelledRebuildCleansUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.count(t, "t1", "a", 0, 40)
	b.db.WaitVisible(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{
		BatchSize: 5,
		Progress: func(p rebuild.Progress) {
			if p.Events >= 10 {
				cancel()
			}
		},
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
}

// A handler that appends events or writes outside its table is caught
// during the rebuild, before anything of it commits.
func TestRebuildCatchesHandlersThatTouchMore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:sneaky")
	b.count(t, "t1", "a", 0, 10)
	b.drain(t, d, "test:sneaky")
	events := b.int(t, `SELECT count(*) FROM events`)

	b.appendAt.Store(4)
	_, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:sneaky", &rebuild.Config{BatchSize: 3})
	require.ErrorIs(t, err, rebuild.ErrNotRebuildable)
	require.ErrorContains(t, err, "appended events")
	require.Equal(t, events, b.int(t, `SELECT count(*) FROM events`), "nothing appended")

	b.appendAt.Store(-1)
	b.foreignAt.Store(6)
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:sneaky", &rebuild.Config{BatchSize: 3})
	require.ErrorIs(t, err, rebuild.ErrNotRebuildable)
	require.ErrorContains(t, err, "public.elsewhere")
	require.Zero(t, b.int(t, `SELECT count(*) FROM elsewhere`), "the foreign write did not commit")
	require.Equal(t, int64(10), b.int(t, `SELECT count(*) FROM sneaky`), "the live table is untouched")
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))

	b.foreignAt.Store(-1)
	res, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:sneaky", nil)
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Events)
	require.Equal(t, int64(10), b.int(t, `SELECT count(*) FROM sneaky`))
}

// The rebuild of a dead projection (its bug since fixed) revives it at the
// rebuilt cursor.
func TestRebuildRevivesDeadConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:tally")
	b.failAt.Store(5)
	b.count(t, "t1", "a", 0, 10)
	b.runUntilDead(t, d)
	b.failAt.Store(-1) // the fix is deployed
	// The consumer died before it saw the last events: wait until they are
	// below the horizon, so that the rebuild reaches them all.
	b.db.WaitVisible(t)
	res, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", nil)
	require.NoError(t, err)
	require.Equal(t, int64(10), res.Events)
	require.Equal(t, "idle", func() string {
		var s string
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT status FROM event_consumers WHERE name = 'test:tally'`).Scan(&s))
		return s
	}())
	require.Zero(t, b.lag(t, "test:tally"))
	b.count(t, "t1", "a", 10, 3)
	b.drain(t, d, "test:tally")
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table)
}

// The swap waits for a live pass in flight (it holds the pass lock) and
// retries after its lock timeout.
func TestSwapWaitsForLivePass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:tally")
	b.count(t, "t1", "a", 0, 10)
	b.drain(t, d, "test:tally")

	// A live pass that holds the consumer's lock for a while.
	pass, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = pass.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('test:tally' || chr(31) || '__shared__', 0))`)
	require.NoError(t, err)
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(700 * time.Millisecond)
		released <- time.Now()
		_ = pass.Rollback(ctx)
	}()
	res, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{SwapLockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	done := time.Now()
	require.True(t, done.After(<-released), "the swap finished while the live pass held its lock")
	require.Equal(t, int64(10), res.Events)
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table)
}

// A rebuild cancelled while its swap waits for the live consumer's lock
// (a query in flight on its own connection) still cleans up after itself.
func TestCancelDuringSwapCleansUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:tally")
	b.count(t, "t1", "a", 0, 10)
	b.drain(t, d, "test:tally")
	oid := b.oid(t, "tally")

	pass, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = pass.Rollback(ctx) }()
	_, err = pass.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('test:tally' || chr(31) || '__shared__', 0))`)
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// Cancel once the swap waits for the live consumer's lock.
		defer cancel()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			var waiting bool
			err := b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database()
				AND wait_event_type = 'Lock' AND query LIKE '%pg_advisory_xact_lock%')`).Scan(&waiting)
			if err != nil || waiting {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err = rebuild.Rebuild(rctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{SwapLockTimeout: 30 * time.Second})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, oid, b.oid(t, "tally"))
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table)
}

// A projection table with a serial column can be rebuilt: the new table's
// default draws from the live table's sequence, which passes to it at the
// swap (dropping the live table would otherwise drop the sequence the new
// table's default needs), so the numbering goes on and the sequence still
// belongs to the table.
func TestRebuildTableWithSerialColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("serial")
	ev := framework.DefineEvent[counted](f, "counted", nil)
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE numbered (id bigserial PRIMARY KEY, tenant_id text NOT NULL, key text NOT NULL);
		SELECT kumiko_enable_tenancy('numbered');
		GRANT USAGE ON SEQUENCE numbered_id_seq TO kumiko_tenant;
		CREATE POLICY numbered_no_blank_keys ON numbered AS RESTRICTIVE TO kumiko_tenant USING (key <> '') WITH CHECK (key <> '')`)
	require.NoError(t, err)
	rls := readRLS(t, db, "numbered")
	require.Len(t, rls.Policies, 3)
	p := framework.MultiStreamProjection(f, "numbered", &framework.ProjectionOptions{Table: "numbered"})
	framework.On(p, ev, func(ctx context.Context, tx *framework.Tx, e framework.Event[counted]) error {
		_, err := tx.Exec(ctx, `INSERT INTO numbered (tenant_id, key) VALUES ($1, $2)`, e.TenantID, e.Payload.Key)
		return err
	})
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	for i := range 5 {
		_, err := rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "c", ID: "k"}, framework.AnyVersion, ev.With(counted{Key: fmt.Sprint("k", i), N: i}))
		})
		require.NoError(t, err)
	}

	db.WaitVisible(t) // below the horizon, so that the rebuild reaches them all
	res, err := rebuild.Rebuild(ctx, db.Pool, reg, "serial:numbered", nil)
	require.NoError(t, err)
	require.Equal(t, int64(5), res.Events)
	// Kumiko's tenancy policies, and the one written beside them, which the
	// rebuild dropped.
	require.Equal(t, rls, readRLS(t, db, "numbered"), "the new table has the live table's row-level security")
	var rows, maxID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*), max(id) FROM numbered`).Scan(&rows, &maxID))
	require.Equal(t, int64(5), rows)
	var seq *string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_serial_sequence('numbered', 'id')`).Scan(&seq))
	require.NotNil(t, seq, "the sequence no longer belongs to the table")
	require.Equal(t, "public.numbered_id_seq", *seq)
	var next int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO numbered (tenant_id, key) VALUES ('t1', 'after') RETURNING id`).Scan(&next))
	require.Greater(t, next, maxID)
	var schemas int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, rebuild.ShadowSchema("serial:numbered")).Scan(&schemas))
	require.Zero(t, schemas, "the shadow schema is left behind")
}

// Two projections that fill one table: a rebuild of one would swap in a
// table holding only its own rows, and the other's rows would be gone for
// good (its cursor stays past the events that made them). The rebuild is
// refused and the table keeps both.
func TestRebuildRefusesTableSharedWithAnotherProjection(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	reg := framework.NewRegistry()
	f := reg.Feature("stats")
	ev := framework.DefineEvent[counted](f, "counted", nil)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE stats (tenant_id text NOT NULL, source text NOT NULL, n int NOT NULL);
		SELECT kumiko_enable_tenancy('stats')`)
	require.NoError(t, err)
	for _, name := range []string{"from-a", "from-b"} {
		p := framework.MultiStreamProjection(f, name, &framework.ProjectionOptions{Table: "stats"})
		framework.On(p, ev, func(ctx context.Context, tx *framework.Tx, e framework.Event[counted]) error {
			_, err := tx.Exec(ctx, `INSERT INTO stats VALUES ($1, $2, $3)`, e.TenantID, name, e.Payload.N)
			return err
		})
	}
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	for n := range 3 {
		_, err := rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "c", ID: "k"}, framework.AnyVersion, ev.With(counted{Key: "k", N: n}))
		})
		require.NoError(t, err)
	}
	d, err := dispatcher.New(db.Pool, reg, dispatcher.ProjectionConsumers(reg, func(framework.RunIn) bool { return true }),
		&dispatcher.Config{InstanceID: "live"})
	require.NoError(t, err)
	require.NoError(t, d.Register(ctx))
	count := func() int64 {
		var n int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM stats`).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool {
		for _, name := range []string{"stats:from-a", "stats:from-b"} {
			_, err := d.RunOnce(ctx, name)
			require.NoError(t, err)
		}
		return count() == 6
	}, 20*time.Second, 10*time.Millisecond)

	_, err = rebuild.Rebuild(ctx, db.Pool, reg, "stats:from-a", nil)
	require.ErrorIs(t, err, rebuild.ErrNotRebuildable)
	require.ErrorContains(t, err, "stats:from-b")
	require.Equal(t, int64(6), count(), "both projections' rows stay")
}

// A rebuild replaces the live consumer's dead letters with its own: the
// events the old table skipped (here by an operator, before the fix was
// deployed) are in the rebuilt table, so listing them as unapplied would
// send an operator after failures that no longer exist.
func TestRebuildReplacesDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := b.live(t, "test:tally")
	b.failAt.Store(5)
	b.count(t, "t1", "a", 0, 10)
	b.runUntilDead(t, d)
	_, err := dispatcher.Skip(ctx, b.db.Pool, "test:tally", dispatcher.SharedInstance)
	require.NoError(t, err)
	b.drain(t, d, "test:tally")
	require.Equal(t, int64(1), b.int(t, `SELECT count(*) FROM event_dead_letters WHERE consumer = 'test:tally'`))

	b.failAt.Store(-1) // the fix is deployed
	b.db.WaitVisible(t)
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", nil)
	require.NoError(t, err)
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table, "the rebuilt table holds every event")
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_dead_letters WHERE consumer LIKE 'test:tally%'`),
		"the skipped event, applied by the rebuild, is still listed as a dead letter")
}

// A rebuild is the way to change the partitions of a projection whose
// partitions do not line up (the dispatcher refuses to start it): the swap
// replaces the stored rows with the declared partitions, each at the
// rebuild's cursor, and no event is applied twice afterwards.
func TestRebuildRepartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := setupOn(t, kumikotest.NewDB(t), 2)
	d2 := old.live(t, "test:tally")
	for i, key := range []string{"a", "b", "c", "d", "e", "f"} {
		old.count(t, "t1", key, i*10, 5)
	}
	old.db.WaitVisible(t)
	old.drain(t, d2, "test:tally@0") // partition 1 delivers nothing
	require.NotZero(t, old.lag(t, "test:tally@1"))

	b := setupOn(t, old.db, 3)
	d3, err := dispatcher.New(b.db.Pool, b.reg, []dispatcher.Consumer{dispatcher.FromProjection(b.reg.Projection("test:tally"))},
		&dispatcher.Config{InstanceID: "live"})
	require.NoError(t, err)
	require.ErrorIs(t, d3.Register(ctx), dispatcher.ErrLayout)

	res, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", nil)
	require.NoError(t, err)
	require.EqualValues(t, 30, res.Events)
	table, recount := b.tallyRows(t)
	require.Equal(t, recount, table)
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:tally%' AND partition_count <> 3`))
	require.EqualValues(t, 3, b.int(t, `SELECT count(*) FROM event_consumers
		WHERE name IN ('test:tally@0', 'test:tally@1', 'test:tally@2') AND partition_count = 3
		  AND (cursor_commit_key, cursor_position) = ($1::xid8, $2::bigint)`, res.Cursor.CommitKey, res.Cursor.Position))

	// The newer code starts now, and goes on from the rebuild's cursor.
	require.NoError(t, d3.Register(ctx))
	for i, key := range []string{"a", "g", "h", "i"} {
		b.count(t, "t1", key, 100+i*10, 3)
	}
	b.db.WaitVisible(t)
	for i := range 3 {
		b.drain(t, d3, dispatcher.PartitionName("test:tally", i))
	}
	table, recount = b.tallyRows(t)
	require.Equal(t, recount, table)
}

// TestAbandonProjectionNoLongerDeclared: a rebuild killed mid-way leaves a
// shadow schema and a consumer row that pins retention; when the projection
// has since been removed from the code (or renamed), Abandon must still
// remove them, or nothing could.
func TestAbandonProjectionNoLongerDeclared(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	schema := rebuild.ShadowSchema("gone:tally")
	_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %s; CREATE TABLE %s.tally (n int);
		INSERT INTO event_consumers (name, instance_id) VALUES ('gone:tally#rebuild', '__shared__');
		INSERT INTO event_dead_letters (consumer, instance_id, position, event_type, tenant_id, error)
		  VALUES ('gone:tally#rebuild', '__shared__', 1, 'x:event:y', 't1', 'boom')`, schema, schema))
	require.NoError(t, err)
	found, err := rebuild.Abandon(ctx, b.db.Pool, b.reg, "gone:tally")
	require.NoError(t, err)
	require.True(t, found)
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name = 'gone:tally#rebuild'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_dead_letters`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema))
	found, err = rebuild.Abandon(ctx, b.db.Pool, b.reg, "gone:tally")
	require.NoError(t, err)
	require.False(t, found, "nothing left (also what a typo finds)")
	// Rebuilding it is still refused: there are no handlers to replay.
	_, err = rebuild.Rebuild(ctx, b.db.Pool, b.reg, "gone:tally", nil)
	require.ErrorIs(t, err, rebuild.ErrUnknownProjection)
}

// stopWritersAfter lets the writers (which count their commits in written
// and report their end on errs) write n more after the swap, then stops
// them and fails t on an error of theirs.
func stopWritersAfter(t *testing.T, written *atomic.Int64, n int64, stop context.CancelFunc, writers *sync.WaitGroup, errs chan error) {
	t.Helper()
	after := written.Load()
	for written.Load() < after+n {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	writers.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
