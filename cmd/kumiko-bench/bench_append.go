package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

func init() { register(Bench{Name: "append", Run: benchAppend}) }

// appendWorkers is the concurrency of the append figures.
const appendWorkers = 16

// itemAdded is the benchmark event's payload.
type itemAdded struct {
	ID   int64  `json:"id"`
	Note string `json:"note" validate:"required"`
}

// benchItemsDDL is the business table both sides write one row to per
// transaction; it is tenant-scoped like a feature table.
const benchItemsDDL = `CREATE TABLE bench_items (
  tenant_id text NOT NULL, id bigint NOT NULL, note text NOT NULL,
  PRIMARY KEY (tenant_id, id));
SELECT kumiko_enable_tenancy('bench_items')`

const (
	benchItemSQL = `INSERT INTO bench_items (tenant_id, id, note) VALUES ($1, $2, $3)`
	// benchEventSQL is the baseline's event insert: the same columns the
	// framework writes, as a plain insert without the streams head row.
	benchEventSQL = `INSERT INTO events (position, commit_key, tenant_id, stream_type, stream_id, version, type, type_version, payload, metadata)
VALUES (nextval('kumiko_event_position_seq'), pg_current_xact_id(), $1, $2, $3, 1, $4, 1, $5, $6)`
)

// rawTwoStatementTx is the raw pgx baseline: one business row and one event
// row per transaction (pool.Begin, two Execs, Commit).
func rawTwoStatementTx(ctx context.Context, pool *pgxpool.Pool, tenant, rowSQL string, rowArgs []any, streamType, streamID, eventType string, payload any) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, rowSQL, rowArgs...); err != nil {
		return err
	}
	p, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	m, err := json.Marshal(eventstore.Metadata{})
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, benchEventSQL, tenant, streamType, streamID, eventType, p, m); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// rawFrameworkSQL sends, with raw pgx, the statements Runtime.InTx sends
// for the same work: BEGIN, the tenant scope and the business row in one
// pipeline, the gapless append of one event and COMMIT in a second (with
// the consistency token's WAL read when token is set, as an HTTP write
// does). Set against the baseline it shows what the log's design costs in
// the database (the streams head row, row-level security); set against the
// framework, what the Go side adds.
func rawFrameworkSQL(ctx context.Context, pool *pgxpool.Pool, tenant, rowSQL string, rowArgs []any,
	stream eventstore.StreamRef, eventType string, payload any, meta eventstore.Metadata, token bool) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	tenancy.QueueScope(b, tenant)
	b.Queue(rowSQL, rowArgs...)
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	p, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	b = &pgx.Batch{}
	if err := eventstore.QueueAppend(b, stream, eventstore.NoStream, []eventstore.NewEvent{{Type: eventType, TypeVersion: 1, Payload: p, Metadata: meta}},
		func(_ []eventstore.Appended, err error) error { return err }); err != nil {
		return err
	}
	b.Queue("COMMIT")
	if token {
		b.Queue(`SELECT pg_current_wal_insert_lsn()::text`)
	}
	return c.SendBatch(ctx, b).Close()
}

// benchAppend: Runtime.InTx with one business row and one Append per
// transaction against raw pgx doing the same two inserts, at 16 goroutines.
func benchAppend(ctx context.Context, env *Env) ([]Result, error) {
	_, pool, drop, err := evDB(ctx, appendWorkers)
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := pool.Exec(ctx, benchItemsDDL); err != nil {
		return nil, err
	}
	reg := framework.NewRegistry()
	f := reg.Feature("bench")
	added := framework.DefineEvent[itemAdded](f, "item-added", nil)
	rt, err := framework.NewRuntime(reg, pool, nil)
	if err != nil {
		return nil, err
	}
	var ids atomic.Int64
	tenants := make([]string, appendWorkers)
	for i := range tenants {
		tenants[i] = "tenant-" + strconv.Itoa(i%4)
	}
	fw := func(ctx context.Context, w int) error {
		id := ids.Add(1)
		_, err := rt.InTx(ctx, tenants[w], framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			if _, err := tx.Exec(ctx, benchItemSQL, tx.TenantID(), id, "note"); err != nil {
				return err
			}
			return tx.Append(framework.Stream{Type: "item", ID: strconv.FormatInt(id, 10)}, framework.NoStream,
				added.With(itemAdded{ID: id, Note: "note"}))
		})
		return err
	}
	base := func(ctx context.Context, w int) error {
		id := ids.Add(1)
		return rawTwoStatementTx(ctx, pool, tenants[w], benchItemSQL, []any{tenants[w], id, "note"},
			"item", strconv.FormatInt(id, 10), added.Name(), itemAdded{ID: id, Note: "note"})
	}
	sameSQL := func(ctx context.Context, w int) error {
		id := ids.Add(1)
		return rawFrameworkSQL(ctx, pool, tenants[w], benchItemSQL, []any{tenants[w], id, "note"},
			eventstore.StreamRef{TenantID: tenants[w], Type: "item", ID: strconv.FormatInt(id, 10)},
			added.Name(), itemAdded{ID: id, Note: "note"}, eventstore.Metadata{}, false)
	}
	sliceDur, n := 1200*time.Millisecond, 12
	if env.Quick {
		sliceDur, n = 400*time.Millisecond, 2
	}
	ops := []func(context.Context, int) error{fw, base, sameSQL}
	// Operations counted, each one row and one event.
	var written int64
	// Warm up: connections, plans, caches.
	for _, op := range ops {
		k, err := evRun(ctx, appendWorkers, sliceDur, op)
		if err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		written += k
	}
	side := func(name string, op func(context.Context, int) error) evSide {
		return evSide{name: name, run: func() (int64, error) { return evRun(ctx, appendWorkers, sliceDur, op) }}
	}
	totals, err := evCompare("append, 16 goroutines", newEvMeter(ctx, pool), n,
		side("Runtime.InTx", fw),
		side("baseline: raw pgx BEGIN; 2 INSERTs; COMMIT", base),
		side("(raw pgx sending the framework's SQL)", sameSQL))
	if err != nil {
		return nil, err
	}
	for _, t := range totals {
		written += t.ops
	}
	if err := evVerifyWrites(ctx, pool, "bench_items", written); err != nil {
		return nil, err
	}
	const baseline = "raw pgx BEGIN; 2 INSERTs; COMMIT"
	return []Result{
		ratioResult("Runtime.InTx: 1 row + Append(1 event) per tx, 16 goroutines", "tx/s", totals[0].rate(), baseline, totals[1].rate(), 0.90),
		referenceResult("(reference) raw pgx sending the framework's SQL, 16 goroutines", "tx/s", totals[2].rate(), baseline, totals[1].rate()),
	}, nil
}
