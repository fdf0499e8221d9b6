package dispatcher_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/rawpass"
)

// The backlog of BenchmarkRunOnce: benchPasses full batches.
const (
	benchBatch  = 500
	benchPasses = 4
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
	if _, err := db.Pool.Exec(ctx, rawpass.RegisterSQL, "bench:raw"); err != nil {
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
				if _, err := db.Pool.Exec(ctx, rawpass.RewindSQL, name); err != nil {
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
		run(b, "bench:raw", func() (int, error) { return rawpass.Pass(ctx, conn.Conn(), "bench:raw", benchBatch) })
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
