package retention_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/retention"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

type ping struct {
	N int `json:"n"`
}

const (
	pingType  = "test:event:ping"
	pongType  = "test:event:pong"
	notedType = "test:event:noted"
)

// bundle is a test's database, registry and runtime: two pub/sub types
// (ping, pong) and one aggregate type (noted).
type bundle struct {
	db    *kumikotest.DB
	reg   *framework.Registry
	f     *framework.Feature
	ping  framework.EventType[ping]
	pong  framework.EventType[ping]
	noted framework.EventType[ping]
	rt    *framework.Runtime
}

func setup(t *testing.T, register func(b *bundle)) *bundle {
	t.Helper()
	b := &bundle{db: kumikotest.NewDB(t), reg: framework.NewRegistry()}
	b.f = b.reg.Feature("test")
	b.ping = framework.DefineEvent[ping](b.f, "ping", &framework.EventOptions{PubSub: true})
	b.pong = framework.DefineEvent[ping](b.f, "pong", &framework.EventOptions{PubSub: true})
	b.noted = framework.DefineEvent[ping](b.f, "noted", nil)
	if register != nil {
		register(b)
	}
	var err error
	b.rt, err = framework.NewRuntime(b.reg, b.db.Pool, nil)
	require.NoError(t, err)
	return b
}

// write appends n events of ev to stream s/id for tenant t1.
func (b *bundle) write(t *testing.T, ev framework.EventType[ping], id string, n int) {
	t.Helper()
	for i := range n {
		_, err := b.rt.InTx(context.Background(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: id}, framework.AnyVersion, ev.With(ping{N: i}))
		})
		require.NoError(t, err)
	}
}

// age makes every event of typ written so far 40 days old.
func (b *bundle) age(t *testing.T, typ string) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE events SET created_at = now() - interval '40 days' WHERE type = $1`, typ)
	require.NoError(t, err)
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

func (b *bundle) events(t *testing.T, typ string) int {
	t.Helper()
	return b.count(t, `SELECT count(*) FROM events WHERE type = $1`, typ)
}

// listener registers a multi-stream projection of ev that does nothing.
func listener(b *bundle, name string, ev framework.EventType[ping], opts *framework.ProjectionOptions) {
	p := framework.MultiStreamProjection(b.f, name, opts)
	framework.On(p, ev, func(context.Context, *framework.Tx, framework.Event[ping]) error { return nil })
}

func newDispatcher(t *testing.T, b *bundle) *dispatcher.Dispatcher {
	t.Helper()
	d, err := dispatcher.New(b.db.Pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), &dispatcher.Config{InstanceID: "test"})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	return d
}

// drain runs passes until the consumer has delivered want events, once
// every event is visible (so that a pass delivers a full batch, and a
// partial drain stops where the batch size says).
func drain(t *testing.T, b *bundle, d *dispatcher.Dispatcher, name string, want int) {
	t.Helper()
	b.db.WaitVisible(t)
	got := 0
	deadline := time.Now().Add(30 * time.Second)
	for got < want {
		n, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		got += n
		if n == 0 {
			require.True(t, time.Now().Before(deadline), "%s delivered %d of %d", name, got, want)
			time.Sleep(5 * time.Millisecond)
		}
	}
	require.Equal(t, want, got)
}

func prune(t *testing.T, b *bundle, opts *retention.Options) (*retention.Result, error) {
	t.Helper()
	if opts.OlderThanDays == 0 {
		opts.OlderThanDays = 30
	}
	return retention.Prune(context.Background(), b.db.Pool, b.reg, opts)
}

func TestPruneDeletesOldPubSubEventsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, b.ping, "a", 5)
	b.write(t, b.pong, "b", 2)
	b.write(t, b.noted, "c", 4)
	b.age(t, pingType)
	b.age(t, pongType)
	b.age(t, notedType)
	b.write(t, b.ping, "a", 3) // recent: kept

	res, err := prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.Equal(t, []string{pingType, pongType}, res.Types)
	require.Equal(t, map[string]int64{pingType: 5, pongType: 2}, res.Counts)
	require.Equal(t, int64(7), res.Total)
	require.False(t, res.DryRun)
	require.WithinDuration(t, time.Now().Add(-30*24*time.Hour), res.Cutoff, time.Minute)

	require.Equal(t, 3, b.events(t, pingType), "recent events are kept")
	require.Zero(t, b.events(t, pongType))
	require.Equal(t, 4, b.events(t, notedType), "aggregate events are not pruned by default")
	// Stream rows stay, and a stream keeps counting from its version.
	require.Equal(t, 8, b.count(t, `SELECT version::int FROM streams WHERE stream_id = 'a'`))
	require.Equal(t, 2, b.count(t, `SELECT version::int FROM streams WHERE stream_id = 'b'`))
	b.write(t, b.pong, "b", 1)
	require.Equal(t, 3, b.count(t, `SELECT version::int FROM events WHERE stream_id = 'b'`))

	// A second prune finds nothing.
	res, err = prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.Zero(t, res.Total)
}

func TestExplicitTypesMayNameAggregateTypes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, b.ping, "a", 2)
	b.write(t, b.noted, "c", 4)
	b.age(t, pingType)
	b.age(t, notedType)
	res, err := prune(t, b, &retention.Options{Types: []string{notedType, notedType}})
	require.NoError(t, err)
	require.Equal(t, []string{notedType}, res.Types)
	require.Equal(t, map[string]int64{notedType: 4}, res.Counts)
	require.Zero(t, b.events(t, notedType))
	require.Equal(t, 2, b.events(t, pingType), "only the named types")
}

func TestBadInputIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, b.ping, "a", 2)
	b.age(t, pingType)
	_, err := prune(t, b, &retention.Options{Types: []string{pingType, "test:event:nope", "other"}})
	require.ErrorIs(t, err, retention.ErrUnknownType)
	require.ErrorContains(t, err, "test:event:nope, other")
	_, err = retention.Prune(context.Background(), b.db.Pool, b.reg, &retention.Options{OlderThanDays: -1})
	require.ErrorIs(t, err, retention.ErrBadAge)
	_, err = retention.Prune(context.Background(), b.db.Pool, b.reg, nil)
	require.ErrorIs(t, err, retention.ErrBadAge)
	// Beyond the range of a Postgres timestamp: refused up front, not a
	// raw SQL error.
	for _, days := range []int{retention.MaxOlderThanDays + 1, math.MaxInt32 + 1, math.MaxInt} {
		_, err = retention.Prune(context.Background(), b.db.Pool, b.reg, &retention.Options{OlderThanDays: days, Types: []string{pingType}})
		require.ErrorIs(t, err, retention.ErrBadAge, days)
	}
	res, err := retention.Prune(context.Background(), b.db.Pool, b.reg,
		&retention.Options{OlderThanDays: retention.MaxOlderThanDays, Types: []string{pingType}, DryRun: true})
	require.NoError(t, err)
	require.Zero(t, res.Total)
	require.Equal(t, 2, b.events(t, pingType))
}

func TestNoPubSubTypesIsNothingToDo(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	framework.DefineEvent[ping](reg.Feature("test"), "noted", nil)
	require.NoError(t, reg.Build())
	res, err := retention.Prune(context.Background(), db.Pool, reg, &retention.Options{OlderThanDays: 1})
	require.NoError(t, err)
	require.Empty(t, res.Types)
	require.Zero(t, res.Total)
}

// A consumer whose state row the dispatcher pre-registered, but that has
// not run a pass yet, blocks the prune of the events it reads.
func TestPreRegistrationBlocksPrune(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { listener(b, "pings", b.ping, nil) })
	b.write(t, b.ping, "a", 4)
	b.age(t, pingType)
	d := newDispatcher(t, b) // Register only: cursor at the start, no pass yet

	_, err := prune(t, b, &retention.Options{})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	require.Len(t, lag.Consumers, 1)
	require.Equal(t, "test:pings", lag.Consumers[0].Name)
	require.Equal(t, dispatcher.SharedInstance, lag.Consumers[0].InstanceID)
	require.Equal(t, int64(4), lag.Consumers[0].Unseen)
	require.Contains(t, err.Error(), "test:pings")
	require.Contains(t, err.Error(), "kumiko consumer skip")
	require.Contains(t, err.Error(), "kumiko consumer disable")
	require.Equal(t, 4, b.events(t, pingType), "a refused prune deletes nothing")

	drain(t, b, d, "test:pings", 4)
	res, err := prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(4), res.Counts[pingType])
	require.Zero(t, b.events(t, pingType))
}

func TestPruneRefusesUnderLagAndIgnoresDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		listener(b, "pings", b.ping, &framework.ProjectionOptions{BatchSize: 3})
		listener(b, "notes", b.noted, nil) // reads no pruned type
	})
	// A consumer of every type (event_types NULL), as system consumers are.
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO event_consumers (name, instance_id) VALUES ('system:all', 'pod-1')`)
	require.NoError(t, err)
	b.write(t, b.ping, "a", 5)
	b.write(t, b.noted, "c", 2)
	b.age(t, pingType)
	d := newDispatcher(t, b)
	drain(t, b, d, "test:pings", 3) // one batch of 3: two pings unseen

	_, err = prune(t, b, &retention.Options{})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	names := []string{}
	for _, c := range lag.Consumers {
		names = append(names, c.Name+"/"+c.InstanceID)
	}
	require.Equal(t, []string{"system:all/pod-1", "test:pings/__shared__"}, names, "the lagging consumer of ping and the all-types consumer; not the one reading only noted")
	require.Equal(t, int64(2), lag.Consumers[1].Unseen)
	require.Equal(t, 5, b.events(t, pingType))

	drain(t, b, d, "test:pings", 2)
	// A disabled consumer does not hold retention back.
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE event_consumers SET status = 'disabled' WHERE name = 'system:all'`)
	require.NoError(t, err)
	// A dead one does: it resumes where it stopped.
	_, err = b.db.Pool.Exec(context.Background(), `UPDATE event_consumers SET status = 'dead', cursor_commit_key = '0', cursor_position = 0 WHERE name = 'test:pings'`)
	require.NoError(t, err)
	_, err = prune(t, b, &retention.Options{})
	require.ErrorAs(t, err, &lag)
	require.Len(t, lag.Consumers, 1)
	require.Equal(t, "dead", lag.Consumers[0].Status)

	_, err = b.db.Pool.Exec(context.Background(), `UPDATE event_consumers SET status = 'disabled' WHERE name = 'test:pings'`)
	require.NoError(t, err)
	res, err := prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(5), res.Counts[pingType])
	require.Zero(t, b.events(t, pingType))
	require.Equal(t, 2, b.events(t, notedType))
}

// Events newer than the cutoff do not count as lag: a consumer behind only
// on recent events does not block the prune of old ones.
func TestRecentLagDoesNotBlock(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { listener(b, "pings", b.ping, nil) })
	b.write(t, b.ping, "a", 3)
	b.age(t, pingType)
	d := newDispatcher(t, b)
	drain(t, b, d, "test:pings", 3)
	b.write(t, b.ping, "a", 2) // recent and unseen
	res, err := prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Total)
	require.Equal(t, 2, b.events(t, pingType))
}

func TestDryRunDeletesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { listener(b, "pings", b.ping, nil) })
	b.write(t, b.ping, "a", 4)
	b.write(t, b.pong, "b", 1)
	b.age(t, pingType)
	d := newDispatcher(t, b)

	// Under lag, a dry run reports the counts and the refusal.
	res, err := prune(t, b, &retention.Options{DryRun: true})
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	require.NotNil(t, res)
	require.True(t, res.DryRun)
	require.Equal(t, map[string]int64{pingType: 4, pongType: 0}, res.Counts)

	drain(t, b, d, "test:pings", 4)
	res, err = prune(t, b, &retention.Options{DryRun: true})
	require.NoError(t, err)
	require.Equal(t, int64(4), res.Total)
	require.Equal(t, 4, b.events(t, pingType), "a dry run deletes nothing")
	require.Equal(t, 1, b.events(t, pongType))
}

// The prune waits for a consumer change in flight (its SHARE lock conflicts
// with the row update) and then sees it: a consumer rewound by a
// transaction that commits while the prune waits blocks the prune.
func TestPruneWaitsForConsumerChangesAndSeesThem(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { listener(b, "pings", b.ping, nil) })
	b.write(t, b.ping, "a", 3)
	b.age(t, pingType)
	d := newDispatcher(t, b)
	drain(t, b, d, "test:pings", 3)

	ctx := context.Background()
	rewind, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = rewind.Rollback(ctx) }()
	_, err = rewind.Exec(ctx, `UPDATE event_consumers SET cursor_commit_key = '0', cursor_position = 0 WHERE name = 'test:pings'`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := prune(t, b, &retention.Options{})
		done <- err
	}()
	// The prune waits on the table lock.
	deadline := time.Now().Add(10 * time.Second)
	for b.count(t, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'LOCK TABLE event_consumers%'`) == 0 {
		require.True(t, time.Now().Before(deadline), "prune never waited for the consumer table lock")
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("prune finished while a consumer change was in flight: %v", err)
	default:
	}
	require.NoError(t, rewind.Commit(ctx))
	err = <-done
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag, "the prune must see the rewind that committed while it waited")
	require.Equal(t, 3, b.events(t, pingType))
}

func TestOnePruneAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, b.ping, "a", 1)
	b.age(t, pingType)
	ctx := context.Background()
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('kumiko-events-prune', 0))`)
	require.NoError(t, err)
	_, err = prune(t, b, &retention.Options{})
	require.ErrorIs(t, err, retention.ErrPruneRunning)
	_, err = conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('kumiko-events-prune', 0))`)
	require.NoError(t, err)
	res, err := prune(t, b, &retention.Options{})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Total)
}

// The tenant role cannot delete events at all; only the owner's prune can.
func TestTenantRoleCannotDeleteEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, b.ping, "a", 2)
	ctx := context.Background()
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, tenancy.Begin(ctx, conn, "t1", tenancy.Options{}))
	_, err = conn.Exec(ctx, `DELETE FROM events`)
	_, _ = conn.Exec(ctx, `ROLLBACK`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "got %v", err)
	require.Equal(t, "42501", pgErr.Code, fmt.Sprint(err))
	require.Equal(t, 2, b.events(t, pingType))
}
