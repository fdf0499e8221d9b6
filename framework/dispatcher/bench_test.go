package dispatcher_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// The backlog of BenchmarkRunOnce: benchPasses full batches.
const (
	benchBatch  = 500
	benchPasses = 4
)

// The raw pass: the lock / read below the horizon / checkpoint transaction
// of a dispatcher pass, written against pgx directly (the loop
// cmd/kumiko-bench's dispatcher-catchup baseline runs), on a state row of
// its own.
const (
	rawLockSQL = `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`
	rawReadSQL = `SELECT e.position, e.commit_key, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type, e.type_version, e.payload, e.metadata, e.created_at
FROM event_consumers c
JOIN LATERAL (
  SELECT * FROM events
  WHERE (commit_key, position) > (c.cursor_commit_key, c.cursor_position)
    AND commit_key < pg_snapshot_xmin(pg_current_snapshot())
  ORDER BY commit_key, position
  LIMIT $2
) e ON true
WHERE c.name = $1 AND c.instance_id = '__shared__'
ORDER BY e.commit_key, e.position`
	rawAdvanceSQL = `UPDATE event_consumers SET cursor_commit_key = $2, cursor_position = $3, updated_at = now()
WHERE name = $1 AND instance_id = '__shared__'`
	rewindSQL = `UPDATE event_consumers SET cursor_commit_key = '0', cursor_position = 0 WHERE name = $1`
)

// BenchmarkRunOnce measures one pass over a backlog: a batch of 500 events
// read below the visibility horizon, handed to the consumer and
// checkpointed in one transaction. The backlog holds four batches (over
// four tenants and many streams); the cursor is rewound, outside the
// timer, whenever the passes reached its end. events/op is what a pass
// delivered.
//
//   - framework: [dispatcher.Dispatcher.RunOnce] of a shared consumer
//     whose Apply does nothing (the per-event envelope, tenant scoping
//     and metrics are what it adds).
//   - raw-pgx: the same lock / read / checkpoint transaction sent with
//     pgx directly, decoding every column.
func BenchmarkRunOnce(b *testing.B) {
	db := kumikotest.NewDB(b)
	ctx := context.Background()
	reg := framework.NewRegistry()
	f := reg.Feature("bench")
	ticked := framework.DefineEvent[noted](f, "ticked", nil)
	noop := dispatcher.Consumer{Name: "bench:noop", BatchSize: benchBatch,
		Apply: func(context.Context, *framework.Tx, framework.Envelope) error { return nil }}
	d, err := dispatcher.New(db.Pool, reg, []dispatcher.Consumer{noop}, &dispatcher.Config{InstanceID: "bench", BatchSize: benchBatch})
	if err != nil {
		b.Fatal(err)
	}
	fillBacklog(b, db.Pool, ticked.Name(), benchBatch*benchPasses)
	db.WaitVisible(b)
	if err := d.Register(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO event_consumers (name, instance_id) VALUES ('bench:raw', '__shared__')`); err != nil {
		b.Fatal(err)
	}

	// run times b.N passes of pass, rewinding the cursor of name before
	// every benchPasses-th.
	run := func(b *testing.B, name string, pass func() (int, error)) {
		b.ReportAllocs()
		events := 0
		b.ResetTimer()
		for i := range b.N {
			if i%benchPasses == 0 {
				b.StopTimer()
				if _, err := db.Pool.Exec(ctx, rewindSQL, name); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			n, err := pass()
			if err != nil {
				b.Fatal(err)
			}
			if n != benchBatch {
				b.Fatalf("pass %d delivered %d of %d events", i, n, benchBatch)
			}
			events += n
		}
		b.ReportMetric(float64(events)/float64(b.N), "events/op")
		b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	}
	b.Run("framework", func(b *testing.B) {
		run(b, noop.Name, func() (int, error) { return d.RunOnce(ctx, noop.Name) })
	})
	b.Run("raw-pgx", func(b *testing.B) {
		conn, err := db.Pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Release()
		run(b, "bench:raw", func() (int, error) { return rawPass(ctx, conn.Conn(), "bench:raw", benchBatch) })
	})
}

// fillBacklog appends n events of type typ outside any measurement, in
// appends of 100 events spread over four tenants, all in one transaction.
func fillBacklog(b *testing.B, pool *pgxpool.Pool, typ string, n int) {
	b.Helper()
	const perAppend = 100
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for a := 0; a < n; a += perAppend {
		evs := make([]eventstore.NewEvent, 0, perAppend)
		for i := a; i < min(a+perAppend, n); i++ {
			p, err := json.Marshal(noted{N: i})
			if err != nil {
				b.Fatal(err)
			}
			evs = append(evs, eventstore.NewEvent{Type: typ, TypeVersion: 1, Payload: p,
				Metadata: eventstore.Metadata{CorrelationID: "backlog", UserID: "bench"}})
		}
		s := eventstore.StreamRef{TenantID: "tenant-" + strconv.Itoa((a/perAppend)%4), Type: "ticker", ID: strconv.Itoa(a / perAppend)}
		if _, err := eventstore.Append(ctx, tx, s, eventstore.AnyVersion, evs); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}

// rawPass runs one raw pass of the state row name: BEGIN, the lock and
// the read pipelined in one round trip, the checkpoint and COMMIT in a
// second. It returns the number of events read.
func rawPass(ctx context.Context, conn *pgx.Conn, name string, limit int) (int, error) {
	type row struct {
		position, version int64
		commitKey         uint64
		tenant, typ       string
		streamType, id    string
		typeVersion       int
		payload, metadata []byte
		createdAt         time.Time
	}
	var locked bool
	rows := make([]row, 0, limit)
	bt := &pgx.Batch{}
	bt.Queue(`BEGIN`)
	bt.Queue(rawLockSQL, name+"\x1f__shared__").QueryRow(func(r pgx.Row) error { return r.Scan(&locked) })
	bt.Queue(rawReadSQL, name, limit).Query(func(rs pgx.Rows) error {
		for rs.Next() {
			var r row
			if err := rs.Scan(&r.position, &r.commitKey, &r.tenant, &r.streamType, &r.id, &r.version,
				&r.typ, &r.typeVersion, &r.payload, &r.metadata, &r.createdAt); err != nil {
				return err
			}
			rows = append(rows, r)
		}
		return rs.Err()
	})
	if err := conn.SendBatch(ctx, bt).Close(); err != nil {
		return 0, err
	}
	if !locked || len(rows) == 0 {
		_, err := conn.Exec(ctx, `ROLLBACK`)
		return 0, err
	}
	last := rows[len(rows)-1]
	bt = &pgx.Batch{}
	bt.Queue(rawAdvanceSQL, name, last.commitKey, last.position)
	bt.Queue(`COMMIT`)
	if err := conn.SendBatch(ctx, bt).Close(); err != nil {
		return 0, err
	}
	return len(rows), nil
}
