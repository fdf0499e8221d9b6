package eventstore_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// benchInsertEvent is the baseline's event insert: the columns Append
// writes, as a plain INSERT without the streams head row (the statement
// cmd/kumiko-bench's append baseline sends).
const benchInsertEvent = `INSERT INTO events (position, commit_key, tenant_id, stream_type, stream_id, version, type, type_version, payload, metadata)
VALUES (nextval('kumiko_event_position_seq'), pg_current_xact_id(), $1, $2, $3, 1, $4, 1, $5, $6)`

// BenchmarkAppend measures one event appended to a new stream in its own
// transaction (BEGIN, the append, COMMIT: three round trips on both sides),
// sequentially on one fresh database:
//
//   - framework: [eventstore.Append] with [eventstore.NoStream], which
//     also creates the stream's head row and returns the position.
//   - raw-pgx: one INSERT of an equivalent events row, nothing else.
//
// The difference is what the head row and the append statement cost per
// write; cmd/kumiko-bench's "append" figure measures the same under load.
func BenchmarkAppend(b *testing.B) {
	db := kumikotest.NewDB(b)
	ctx := context.Background()
	payload := json.RawMessage(`{"n":1}`)
	var id int // stream ids stay unique across the sub-benchmarks' runs
	b.Run("framework", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			id++
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := eventstore.Append(ctx, tx, stream("fw-"+strconv.Itoa(id)), eventstore.NoStream,
				[]eventstore.NewEvent{{Type: "noted", TypeVersion: 1, Payload: payload}}); err != nil {
				_ = tx.Rollback(ctx)
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-pgx", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			id++
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			meta, err := json.Marshal(eventstore.Metadata{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, benchInsertEvent, "t1", "thing", "raw-"+strconv.Itoa(id), "noted", []byte(payload), meta); err != nil {
				_ = tx.Rollback(ctx)
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchSelectStream is the baseline's stream read: the stream's events in
// version order, without the head row's bound and the gap check.
const benchSelectStream = `SELECT position, commit_key, tenant_id, stream_type, stream_id, version, type, type_version, payload, metadata, created_at
FROM events WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 ORDER BY version`

// BenchmarkReadStream measures reading a whole stream of 10 and of 100
// events outside a transaction, into []eventstore.Record on both sides:
//
//   - framework: [eventstore.ReadStream] with no bound (it reads up to the
//     version of the head row and checks that no event is missing).
//   - raw-pgx: a SELECT of the stream's events ordered by version, scanned
//     with pgx.CollectRows.
func BenchmarkReadStream(b *testing.B) {
	db := kumikotest.NewDB(b)
	ctx := context.Background()
	for _, size := range []int{10, 100} {
		s := stream("read-" + strconv.Itoa(size))
		evs := make([]eventstore.NewEvent, size)
		for i := range evs {
			evs[i] = ev("noted", i)
		}
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := eventstore.Append(ctx, tx, s, eventstore.NoStream, evs); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		b.Run("events="+strconv.Itoa(size), func(b *testing.B) {
			b.Run("framework", func(b *testing.B) {
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					recs, err := eventstore.ReadStream(ctx, db.Pool, s, eventstore.AsOf{})
					if err != nil {
						b.Fatal(err)
					}
					if len(recs) != size {
						b.Fatalf("read %d of %d events", len(recs), size)
					}
				}
			})
			b.Run("raw-pgx", func(b *testing.B) {
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					rows, err := db.Pool.Query(ctx, benchSelectStream, s.TenantID, s.Type, s.ID)
					if err != nil {
						b.Fatal(err)
					}
					recs, err := pgx.CollectRows(rows, scanRecord)
					if err != nil {
						b.Fatal(err)
					}
					if len(recs) != size {
						b.Fatalf("read %d of %d events", len(recs), size)
					}
				}
			})
		})
	}
}

// scanRecord scans one row of benchSelectStream.
func scanRecord(row pgx.CollectableRow) (eventstore.Record, error) {
	var r eventstore.Record
	err := row.Scan(&r.Position, &r.CommitKey, &r.TenantID, &r.StreamType, &r.StreamID, &r.Version,
		&r.Type, &r.TypeVersion, (*[]byte)(&r.Payload), &r.Metadata, &r.CreatedAt)
	return r, err
}
