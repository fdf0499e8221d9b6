package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// ordered is a projection that records every event with a sequence number
// taken when its handler ran, so tests can compare delivery order.
func ordered(b *bundle, name string, opts *framework.ProjectionOptions, before func(context.Context, framework.Event[noted]) error) {
	p := framework.MultiStreamProjection(b.f, name, opts)
	framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
		if before != nil {
			if err := before(ctx, e); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO delivered (tenant_id, consumer, position, stream_id) VALUES ($1, $2, $3, $4)`,
			tx.TenantID(), name, e.ID, e.Stream.ID)
		return err
	})
}

func setupOrdered(t *testing.T, register func(b *bundle)) *bundle {
	t.Helper()
	return setup(t, func(b *bundle) {
		_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE delivered (seq bigserial, tenant_id text NOT NULL,
			consumer text, position bigint, stream_id text);
			SELECT kumiko_enable_tenancy('delivered');
			GRANT USAGE ON SEQUENCE delivered_seq_seq TO kumiko_tenant`)
		require.NoError(t, err)
		register(b)
	})
}

// redeclare returns a registry of newer code: the ordered projection "p"
// with the given partitions.
func redeclare(b *bundle, partitions int) *framework.Registry {
	reg := framework.NewRegistry()
	f, ev := b.f, b.noted
	defer func() { b.f, b.noted = f, ev }()
	b.f = reg.Feature("test")
	b.noted = framework.DefineEvent[noted](b.f, "noted", nil)
	ordered(b, "p", &framework.ProjectionOptions{Partitions: partitions}, nil)
	return reg
}

// streamInPartition returns a stream id (of those write uses) that hashes
// to partition i of n.
func streamInPartition(t *testing.T, b *bundle, i, n int) string {
	t.Helper()
	for s := range 1000 {
		var p int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT kumiko_stream_partition($1, $2)`, fmt.Sprint(s), n).Scan(&p))
		if p == i {
			return fmt.Sprint(s)
		}
	}
	t.Fatalf("no stream id of partition %d of %d", i, n)
	return ""
}

// passUntilEmpty runs passes of the state row name until one delivers
// nothing (the caller made its events visible) and returns how many
// events they delivered.
func passUntilEmpty(t *testing.T, d *dispatcher.Dispatcher, name string) int {
	t.Helper()
	total := 0
	for {
		n, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err)
		if n == 0 {
			return total
		}
		total += n
	}
}

// requireExactlyOnceInStreamOrder checks the delivered table: every event
// once, and each stream's events in position order.
func requireExactlyOnceInStreamOrder(t *testing.T, b *bundle, consumer string, want int) {
	t.Helper()
	require.Equal(t, want, count(t, b, `SELECT count(*) FROM delivered WHERE consumer = $1`, consumer))
	require.Equal(t, want, count(t, b, `SELECT count(DISTINCT position) FROM delivered WHERE consumer = $1`, consumer), "an event delivered twice")
	require.Zero(t, count(t, b, `SELECT count(*) FROM (
		SELECT position < lag(position) OVER (PARTITION BY tenant_id, stream_id ORDER BY seq) AS back
		FROM delivered WHERE consumer = $1) x WHERE back`, consumer), "a stream's events out of order")
}

// Partitions split delivery by stream: two processes running four
// partitions deliver every event exactly once, each stream in order, and
// every partition reads only its own streams.
func TestPartitionsDeliverEveryEventOnceInStreamOrder(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) { ordered(b, "p", &framework.ProjectionOptions{Partitions: 4}, nil) })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, inst := range []string{"one", "two"} {
		d, err := dispatcher.New(b.db.Pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), &dispatcher.Config{
			InstanceID: inst, PollInterval: 10 * time.Millisecond, BatchSize: 7, MaxConcurrentPasses: 4})
		require.NoError(t, err)
		require.Equal(t, []string{"test:p@0", "test:p@1", "test:p@2", "test:p@3"}, d.Consumers())
		wg.Go(func() { require.NoError(t, d.Run(ctx)) })
	}
	var writers sync.WaitGroup
	for w := range 3 {
		writers.Go(func() { b.write(t, fmt.Sprintf("t%d", w), w*60, 60, 11) })
	}
	writers.Wait()
	require.Eventually(t, func() bool {
		return count(t, b, `SELECT count(*) FROM delivered`) >= 180
	}, 60*time.Second, 20*time.Millisecond)
	cancel()
	wg.Wait()
	requireExactlyOnceInStreamOrder(t, b, "p", 180)
	// Each partition delivered only the events of its streams, and all of
	// them: its events_processed matches the count of its streams' events.
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_consumers c WHERE c.name LIKE 'test:p@%'
		AND c.events_processed <> (SELECT count(*) FROM events e WHERE kumiko_stream_partition(e.stream_id, 4) = c.partition_index)`))
	require.Equal(t, 4, count(t, b, `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:p@%' AND partition_count = 4 AND events_processed > 0`))
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_consumers WHERE name = 'test:p'`), "no unpartitioned row")
}

// A partition whose handler is stuck holds up only its own streams: the
// other partition delivers meanwhile. (One cursor would wait.)
func TestPartitionsRunInParallel(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var stuck string
	b := setupOrdered(t, func(b *bundle) {
		ordered(b, "p", &framework.ProjectionOptions{Partitions: 2}, func(ctx context.Context, e framework.Event[noted]) error {
			if e.Stream.ID == stuck {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	})
	stuck = streamInPartition(t, b, 0, 2)
	free := streamInPartition(t, b, 1, 2)
	d, err := dispatcher.New(b.db.Pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), &dispatcher.Config{
		InstanceID: "one", PollInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { require.NoError(t, d.Run(ctx)) })
	appendTo := func(stream string, n int) {
		_, err := b.rt.InTx(context.Background(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: stream}, framework.AnyVersion, b.noted.With(noted{N: n}))
		})
		require.NoError(t, err)
	}
	appendTo(stuck, 1)
	appendTo(free, 2)
	require.Eventually(t, func() bool {
		return count(t, b, `SELECT count(*) FROM delivered WHERE stream_id = $1`, free) == 1
	}, 30*time.Second, 10*time.Millisecond, "the free partition waits for the stuck one")
	require.Zero(t, count(t, b, `SELECT count(*) FROM delivered WHERE stream_id = $1`, stuck))
	close(release)
	require.Eventually(t, func() bool {
		return count(t, b, `SELECT count(*) FROM delivered`) == 2
	}, 30*time.Second, 10*time.Millisecond)
}

// An unpartitioned consumer that is given partitions continues where its
// one cursor stood: no event is delivered twice, none is lost.
func TestPartitioningAConsumerKeepsItsCursor(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) { ordered(b, "p", nil, nil) })
	one := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 40, 9)
	drain(t, one, "test:p", 40)
	b.write(t, "t1", 40, 25, 9)

	// The same consumer, declared with three partitions by newer code.
	reg := redeclare(b, 3)
	three, err := dispatcher.New(b.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "new"})
	require.NoError(t, err)
	require.NoError(t, three.Register(context.Background()))
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_consumers WHERE name = 'test:p'`), "the old row is replaced")
	require.Equal(t, 3, count(t, b, `SELECT count(*) FROM event_consumers c WHERE name LIKE 'test:p@%' AND partition_count = 3
		AND (cursor_commit_key, cursor_position) = (SELECT commit_key, position FROM events ORDER BY commit_key, position OFFSET 39 LIMIT 1)`),
		"every partition starts at the old cursor")
	require.Equal(t, 40, count(t, b, `SELECT sum(events_processed) FROM event_consumers WHERE name LIKE 'test:p@%'`))
	b.db.WaitVisible(t) // a partition's pass stops at the first empty batch
	total := 0
	for i := range 3 {
		total += passUntilEmpty(t, three, dispatcher.PartitionName("test:p", i))
	}
	require.Equal(t, 25, total)
	requireExactlyOnceInStreamOrder(t, b, "p", 65)
	// Registering again changes nothing.
	require.NoError(t, three.Register(context.Background()))
	require.Equal(t, 3, count(t, b, `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:p%'`))
}

// Partitions whose cursors do not line up cannot be re-partitioned: some
// events would be delivered twice or never. Registration refuses, says
// which partitions are behind, and changes nothing; once they caught up,
// the change goes through. Run returns the refusal instead of retrying.
func TestRepartitioningWaitsForPartitionsToLineUp(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) { ordered(b, "p", &framework.ProjectionOptions{Partitions: 2}, nil) })
	two := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 30, 7)
	b.db.WaitVisible(t)
	// Partition 0 delivers everything, partition 1 nothing.
	passUntilEmpty(t, two, "test:p@0")
	behind := count(t, b, `SELECT count(*) FROM events WHERE kumiko_stream_partition(stream_id, 2) = 1`)
	require.NotZero(t, behind)

	reg := redeclare(b, 3)
	three, err := dispatcher.New(b.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "new"})
	require.NoError(t, err)
	err = three.Register(context.Background())
	require.ErrorIs(t, err, dispatcher.ErrLayout)
	var le *dispatcher.LayoutError
	require.True(t, errors.As(err, &le))
	require.Equal(t, []string{"test:p@1"}, le.Behind)
	require.Contains(t, err.Error(), "consumer test:p: its state rows have 2 partition(s), the code declares 3")
	require.Contains(t, err.Error(), "kumiko projection rebuild test:p")
	require.Empty(t, le.Stopped)
	require.NotContains(t, err.Error(), "disabled or dead")
	require.False(t, three.Registered())
	// A partition behind that is disabled never catches up by itself: the
	// refusal says so.
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:p@1", ""))
	err = three.Register(context.Background())
	require.True(t, errors.As(err, &le))
	require.Equal(t, []string{"test:p@1"}, le.Stopped)
	require.Contains(t, err.Error(), "(test:p@1 disabled or dead: enable or restart them with kumiko consumer")
	require.NoError(t, dispatcher.Enable(context.Background(), b.db.Pool, "test:p@1", ""))
	require.Equal(t, 2, count(t, b, `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:p@%' AND partition_count = 2`), "nothing changed")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.ErrorIs(t, three.Run(ctx), dispatcher.ErrLayout, "Run gives up at once")
	require.NoError(t, ctx.Err())

	drain(t, two, "test:p@1", behind)
	require.NoError(t, three.Register(context.Background()))
	require.Equal(t, 3, count(t, b, `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:p@%' AND partition_count = 3`))
	b.write(t, "t1", 30, 12, 7)
	b.db.WaitVisible(t)
	for i := range 3 {
		passUntilEmpty(t, three, dispatcher.PartitionName("test:p", i))
	}
	requireExactlyOnceInStreamOrder(t, b, "p", 42)
}

// A per-instance consumer's refusal does not suggest a rebuild, which
// takes shared projections only.
func TestLayoutErrorOfPerInstanceRowsSuggestsNoRebuild(t *testing.T) {
	t.Parallel()
	shared := (&dispatcher.LayoutError{Consumer: "x:p", Instance: dispatcher.SharedInstance, Stored: 2, Declared: 3, Behind: []string{"x:p@1"}}).Error()
	require.Contains(t, shared, "kumiko projection rebuild x:p")
	mine := (&dispatcher.LayoutError{Consumer: "x:p", Instance: "api1", Stored: 2, Declared: 3, Behind: []string{"x:p@1"}}).Error()
	require.NotContains(t, mine, "rebuild")
	require.Contains(t, mine, "consumer x:p (instance api1): its state rows have 2 partition(s), the code declares 3")
	require.Contains(t, mine, "run the code with 2 partition(s) until those have caught up")
}

// Skip and the lag work on one partition's share of the log.
func TestSkipAndLagOfAPartition(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) {
		ordered(b, "p", &framework.ProjectionOptions{Partitions: 2, MaxAttempts: 1}, func(_ context.Context, e framework.Event[noted]) error {
			return errors.New("poison")
		})
	})
	d := newDispatcher(t, b, nil)
	s0, s1 := streamInPartition(t, b, 0, 2), streamInPartition(t, b, 1, 2)
	for i, s := range []string{s1, s1, s0} {
		_, err := b.rt.InTx(context.Background(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: s}, framework.AnyVersion, b.noted.With(noted{N: i}))
		})
		require.NoError(t, err)
	}
	b.db.WaitVisible(t)
	rows, err := dispatcher.List(context.Background(), b.db.Pool)
	require.NoError(t, err)
	lags := map[string]int64{}
	for _, r := range rows {
		lags[r.Name] = r.Lag
		require.Equal(t, 2, r.Partitions)
	}
	require.Equal(t, map[string]int64{"test:p@0": 1, "test:p@1": 2}, lags)
	// Partition 0's next event is the third, not the first of the log.
	dl, err := dispatcher.Skip(context.Background(), b.db.Pool, "test:p@0", "")
	require.NoError(t, err)
	var want int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT position FROM events WHERE stream_id = $1`, s0).Scan(&want))
	require.Equal(t, want, dl.Position)
	st, err := dispatcher.Status(context.Background(), b.db.Pool, "test:p@0", "")
	require.NoError(t, err)
	require.Zero(t, st.Lag)
	require.Equal(t, 0, st.Partition)
	_ = d
	// The consumer's own name has no row; the verbs say which rows it has.
	_, err = dispatcher.Status(context.Background(), b.db.Pool, "test:p", "")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	require.EqualError(t, err, "consumer test:p is partitioned: name one of its 2 partitions, test:p@0 to test:p@1")
	_, err = dispatcher.Skip(context.Background(), b.db.Pool, "test:p", "")
	require.EqualError(t, err, "consumer test:p is partitioned: name one of its 2 partitions, test:p@0 to test:p@1")
}

func TestBadPartitionsAreRefused(t *testing.T) {
	t.Parallel()
	reg := framework.NewRegistry()
	f := reg.Feature("test")
	framework.MultiStreamProjection(f, "neg", &framework.ProjectionOptions{Partitions: -1})
	framework.MultiStreamProjection(f, "huge", &framework.ProjectionOptions{Partitions: framework.MaxPartitions + 1})
	err := reg.Build()
	require.ErrorContains(t, err, "projection test:neg: partitions -1 is not between 1 and 64")
	require.ErrorContains(t, err, "projection test:huge: partitions 65 is not between 1 and 64")

	apply := func(context.Context, *framework.Tx, framework.Envelope) error { return nil }
	_, err = dispatcher.New(nil, nil, []dispatcher.Consumer{
		{Name: "x@3", Apply: apply},
		{Name: "y", Apply: apply, Partitions: -2},
		{Name: "z", Apply: apply, BatchSize: -1},
		{Name: "w", Apply: apply, MaxAttempts: -3},
	}, &dispatcher.Config{InstanceID: "i"})
	require.ErrorContains(t, err, "consumer name x@3 ends like a partition's state row")
	require.ErrorContains(t, err, "consumer y: partitions -2 is not between 1 and 64")
	// A negative batch size failed every pass in SQL; negative attempts
	// turned the consumer dead at its first failure.
	require.ErrorContains(t, err, "consumer z: BatchSize must not be negative (got -1)")
	require.ErrorContains(t, err, "consumer w: MaxAttempts must not be negative (got -3)")
}

// Changing the partitions hands the stored rows' dead letters to the new
// partition of each event's stream, as a rebuild does: the old row names
// are gone, and an operator looks a partition's dead letters up by its
// row's name.
func TestRepartitioningKeepsDeadLetters(t *testing.T) {
	t.Parallel()
	const poison = "1"
	b := setupOrdered(t, func(b *bundle) {
		ordered(b, "p", &framework.ProjectionOptions{SkipApplyErrors: true}, func(_ context.Context, e framework.Event[noted]) error {
			if e.Stream.ID == poison {
				return errors.New("poison")
			}
			return nil
		})
	})
	one := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 6, 3)
	b.db.WaitVisible(t)
	for {
		n, err := one.RunOnce(context.Background(), "test:p")
		require.NoError(t, err)
		if n == 0 && count(t, b, `SELECT count(*) FROM event_dead_letters`) == 2 {
			break
		}
	}

	for _, partitions := range []int{3, 2, 1} {
		reg := redeclare(b, partitions)
		d, err := dispatcher.New(b.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "new"})
		require.NoError(t, err)
		require.NoError(t, d.Register(context.Background()))
		name := "test:p"
		if partitions > 1 {
			var k int
			require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT kumiko_stream_partition($1, $2)`, poison, partitions).Scan(&k))
			name = dispatcher.PartitionName("test:p", k)
		}
		st, err := dispatcher.Status(context.Background(), b.db.Pool, name, "")
		require.NoError(t, err)
		require.Len(t, st.DeadLetters, 2, "the dead letters of %d partitions", partitions)
		require.Equal(t, 2, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = $1`, name), "no dead letter left under a removed row")
	}
}

// Rewinding every partition to the same event: a partition whose cursor
// is before the target, with only other partitions' events in between,
// has nothing of its own to replay there, so its cursor stays (the target
// is not "forward" for it), as for a consumer at the start.
func TestRewindAPartitionPastOtherPartitionsEvents(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) { ordered(b, "p", &framework.ProjectionOptions{Partitions: 2}, nil) })
	d := newDispatcher(t, b, nil)
	s0, s1 := streamInPartition(t, b, 0, 2), streamInPartition(t, b, 1, 2)
	var positions []int64
	for i, s := range []string{s1, s0, s0, s0} {
		_, err := b.rt.InTx(context.Background(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: s}, framework.AnyVersion, b.noted.With(noted{N: i}))
		})
		require.NoError(t, err)
	}
	require.NoError(t, positionsInOrder(b, &positions))
	b.db.WaitVisible(t)
	drain(t, d, "test:p@0", 3)
	drain(t, d, "test:p@1", 1)

	ctx := context.Background()
	to := dispatcher.RewindTo{Position: positions[2]}
	res0, err := dispatcher.Rewind(ctx, b.db.Pool, "test:p@0", "", to)
	require.NoError(t, err)
	require.NotEqual(t, res0.From, res0.To)
	res1, err := dispatcher.Rewind(ctx, b.db.Pool, "test:p@1", "", to)
	require.NoError(t, err, "partition 1 has no event between its cursor and the target")
	require.Equal(t, res1.From, res1.To)
	drain(t, d, "test:p@0", 2)
	n, err := d.RunOnce(ctx, "test:p@1")
	require.NoError(t, err)
	require.Zero(t, n)

	// A partition with an event of its own between stays refused.
	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:p@1", "", dispatcher.RewindTo{Position: positions[0]})
	require.NoError(t, err)
	_, err = dispatcher.Rewind(ctx, b.db.Pool, "test:p@1", "", to)
	require.ErrorIs(t, err, dispatcher.ErrRewindForward)
}

// positionsInOrder reads the events' positions in delivery order.
func positionsInOrder(b *bundle, out *[]int64) error {
	rows, err := b.db.Pool.Query(context.Background(), `SELECT position FROM events ORDER BY commit_key, position`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var p int64
		if err := rows.Scan(&p); err != nil {
			return err
		}
		*out = append(*out, p)
	}
	return rows.Err()
}

// Register's conversion waits for the passes of the rows it read; when the
// rows were replaced meanwhile (a rebuild's swap writes the partitions its
// code declares, without Register's lock), it must not convert rows whose
// passes it does not hold: a pass of such a row in flight would commit its
// events and move a cursor of the new layout. It gives up the attempt
// instead, and the next one waits for that pass.
func TestRegisterDoesNotConvertRowsReplacedWhileItWaited(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) { ordered(b, "p", nil, nil) })
	newDispatcher(t, b, nil)
	ctx := context.Background()
	// A stream in partition 0 of 2 and not in partition 0 of 3.
	stream := ""
	for s := range 1000 {
		var p2, p3 int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT kumiko_stream_partition($1, 2), kumiko_stream_partition($1, 3)`, fmt.Sprint(s)).Scan(&p2, &p3))
		if p2 == 0 && p3 != 0 {
			stream = fmt.Sprint(s)
			break
		}
	}
	require.NotEmpty(t, stream)
	_, err := b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		return tx.Append(framework.Stream{Type: "s", ID: stream}, framework.AnyVersion, b.noted.With(noted{N: 1}))
	})
	require.NoError(t, err)
	b.db.WaitVisible(t)

	// The swap's pass lock of the stored row.
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, dispatcher.LockKey("test:p", dispatcher.SharedInstance))
	require.NoError(t, err)

	reg3 := redeclare(b, 3)
	three, err := dispatcher.New(b.db.Pool, reg3, dispatcher.ProjectionConsumers(reg3, nil), &dispatcher.Config{InstanceID: "three"})
	require.NoError(t, err)
	registered := make(chan error, 1)
	go func() { registered <- three.Register(ctx) }()
	require.Eventually(t, func() bool {
		return count(t, b, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`) > 0
	}, 10*time.Second, 5*time.Millisecond, "Register waits for the stored row's pass")

	// The swap replaces the row with two partitions at its cursor.
	_, err = b.db.Pool.Exec(ctx, `WITH old AS (DELETE FROM event_consumers WHERE name = 'test:p' RETURNING *)
		INSERT INTO event_consumers (name, instance_id, event_types, cursor_commit_key, cursor_position, partition_index, partition_count)
		SELECT 'test:p@' || i, instance_id, event_types, cursor_commit_key, cursor_position, i, 2 FROM old, generate_series(0, 1) i`)
	require.NoError(t, err)
	// A process declaring two partitions starts a pass of partition 0.
	entered, release := make(chan struct{}), make(chan struct{})
	reg2 := framework.NewRegistry()
	f2 := reg2.Feature("test")
	ev2 := framework.DefineEvent[noted](f2, "noted", nil)
	saved, savedEv := b.f, b.noted
	b.f, b.noted = f2, ev2
	ordered(b, "p", &framework.ProjectionOptions{Partitions: 2}, func(context.Context, framework.Event[noted]) error {
		close(entered)
		<-release
		return nil
	})
	b.f, b.noted = saved, savedEv
	two, err := dispatcher.New(b.db.Pool, reg2, dispatcher.ProjectionConsumers(reg2, nil), &dispatcher.Config{InstanceID: "two"})
	require.NoError(t, err)
	passed := make(chan error, 1)
	go func() {
		_, err := two.RunOnce(ctx, "test:p@0")
		passed <- err
	}()
	<-entered
	// The swap commits; Register goes on while the pass is in flight.
	require.NoError(t, holder.Rollback(ctx))
	select {
	case err := <-registered:
		require.Error(t, err, "Register converted rows whose pass it did not hold")
		require.NotErrorIs(t, err, dispatcher.ErrLayout)
	case <-time.After(2 * time.Second):
		// Waiting for the pass is right too.
	}
	close(release)
	require.NoError(t, <-passed)
	require.NoError(t, three.Register(ctx))
	for i := range 3 {
		passUntilEmpty(t, three, dispatcher.PartitionName("test:p", i))
	}
	requireExactlyOnceInStreamOrder(t, b, "p", 1)
}

// A partition an operator disabled keeps the consumer paused through a
// change of the partition count: every new row starts disabled.
func TestRepartitioningKeepsADisabledPartitionPaused(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) { ordered(b, "p", &framework.ProjectionOptions{Partitions: 2}, nil) })
	newDispatcher(t, b, nil) // registers both rows at the start of the log: they line up
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "test:p@1", ""))
	reg := redeclare(b, 3)
	three, err := dispatcher.New(b.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "new"})
	require.NoError(t, err)
	require.NoError(t, three.Register(context.Background()))
	require.Equal(t, 3, count(t, b, `SELECT count(*) FROM event_consumers WHERE name LIKE 'test:p@%' AND partition_count = 3 AND status = 'disabled'`))
}

// Events waiting above the visibility horizon make a consumer poll again
// soon, but only events of its own types and partition: others would have
// every consumer of a busy log re-poll for nothing.
func TestOnlyOwnEventsAboveTheHorizonHurryAPass(t *testing.T) {
	t.Parallel()
	var other framework.EventType[noted]
	b := setupOrdered(t, func(b *bundle) {
		other = framework.DefineEvent[noted](b.f, "other", nil)
		ordered(b, "p", &framework.ProjectionOptions{Partitions: 2}, nil)
	})
	d := newDispatcher(t, b, nil)
	ctx := context.Background()
	// An open transaction with an xid holds the horizon below what commits
	// after it.
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	s0, s1 := streamInPartition(t, b, 0, 2), streamInPartition(t, b, 1, 2)
	appendTo := func(stream string, ev framework.EventType[noted]) {
		_, err := b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "s", ID: stream}, framework.AnyVersion, ev.With(noted{N: 1}))
		})
		require.NoError(t, err)
	}
	appendTo(s0, other)   // not of the consumer's types
	appendTo(s1, b.noted) // of its types, partition 1
	pending := func(name string) bool {
		p, err := d.PassPending(ctx, name)
		require.NoError(t, err)
		return p
	}
	require.False(t, pending("test:p@0"), "another type's event above the horizon")
	require.True(t, pending("test:p@1"))
	appendTo(s0, b.noted)
	require.True(t, pending("test:p@0"))
}

// TestOldPartitionCountSaysWhyItsRowIsGone: a process still running with
// the old partition count after another one changed it finds no state row
// for its partitions, on every pass: the error says that another
// partition count may have replaced the rows, not only that a row is
// missing.
func TestOldPartitionCountSaysWhyItsRowIsGone(t *testing.T) {
	t.Parallel()
	b := setupOrdered(t, func(b *bundle) { ordered(b, "p", &framework.ProjectionOptions{Partitions: 2}, nil) })
	d := newDispatcher(t, b, nil)
	// What a process with one partition left of the rows.
	_, err := b.db.Pool.Exec(context.Background(), `DELETE FROM event_consumers WHERE name = 'test:p@1'`)
	require.NoError(t, err)
	_, err = d.RunOnce(context.Background(), "test:p@1")
	require.ErrorContains(t, err, "consumer test:p@1/__shared__ has no state row: a process with another partition count of test:p "+
		"may have replaced the rows (stop the processes that run the old count), or the row was removed")
}
