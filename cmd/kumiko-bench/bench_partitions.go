package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

func init() {
	register(Bench{Name: "dispatcher-partitions", Run: benchPartitions})
}

// benchPartitionCount is the partitioned side's partition count.
const benchPartitionCount = 4

// benchPartitions: catch-up of a backlog by a projection whose handler
// waits for one upsert round trip per event, in four partitions passing in
// parallel against the same projection with one cursor. The round trips of
// one cursor's passes leave the cores idle between them; the partitions
// fill that time.
func benchPartitions(ctx context.Context, env *Env) ([]Result, error) {
	n, rounds := 60_000, 4
	if env.Quick {
		n, rounds = 8_000, 2
	}
	const batch = 500
	_, pool, drop, err := evDB(ctx, 2*benchPartitionCount+2)
	if err != nil {
		return nil, err
	}
	defer drop()
	reg := framework.NewRegistry()
	f := reg.Feature("bench")
	ticked := framework.DefineEvent[tick](f, "ticked", nil)
	for _, side := range []struct {
		name       string
		partitions int
	}{{"one", 1}, {"parted", benchPartitionCount}} {
		table := "bench_" + side.name
		if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (tenant_id text NOT NULL, customer text NOT NULL,
  events bigint NOT NULL, last_n bigint NOT NULL, PRIMARY KEY (tenant_id, customer));
SELECT kumiko_enable_tenancy('`+table+`')`); err != nil {
			return nil, err
		}
		upsert := `INSERT INTO ` + table + ` AS t (tenant_id, customer, events, last_n) VALUES ($1, $2, 1, $3)
ON CONFLICT (tenant_id, customer) DO UPDATE SET events = t.events + 1, last_n = EXCLUDED.last_n`
		p := framework.MultiStreamProjection(f, side.name, &framework.ProjectionOptions{Table: table, BatchSize: batch, Partitions: side.partitions})
		// tx.Exec, not tx.Queue: a handler that waits for its statement.
		framework.On(p, ticked, func(ctx context.Context, tx *framework.Tx, e framework.Event[tick]) error {
			_, err := tx.Exec(ctx, upsert, e.TenantID, e.Payload.Customer, e.Payload.N)
			return err
		})
	}
	d, err := dispatcher.New(pool, reg, dispatcher.ProjectionConsumers(reg, nil),
		&dispatcher.Config{InstanceID: "bench", BatchSize: batch, MaxConcurrentPasses: benchPartitionCount})
	if err != nil {
		return nil, err
	}
	if err := backlogThenRegister(ctx, pool, d, ticked.Name(), n); err != nil {
		return nil, err
	}
	one := func() (int64, error) {
		if _, err := pool.Exec(ctx, `TRUNCATE bench_one`); err != nil {
			return 0, err
		}
		return dispatcherCatchUp(ctx, pool, d, "bench:one", n)
	}
	parted := func() (int64, error) { return partitionsCatchUp(ctx, pool, d, n) }
	// Warm-up.
	for _, run := range []func() (int64, error){one, parted} {
		if _, err := run(); err != nil {
			return nil, err
		}
	}
	m := newEvMeter(ctx, pool)
	totals, err := evCompare(fmt.Sprintf("catch-up of %dk events, 1 upsert round trip/event", n/1000), m, rounds,
		evSide{name: fmt.Sprintf("%d partitions, passing in parallel", benchPartitionCount), run: parted},
		evSide{name: "one cursor", run: one})
	if err != nil {
		return nil, err
	}
	for _, table := range []string{"bench_one", "bench_parted"} {
		var total int64
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(events), 0) FROM `+table).Scan(&total); err != nil {
			return nil, err
		}
		if total != int64(n) {
			return nil, fmt.Errorf("%s counted %d of %d events", table, total, n)
		}
	}
	return []Result{referenceResult(
		fmt.Sprintf("catch-up %dk events, projection in %d partitions, 1 upsert round trip/event", n/1000, benchPartitionCount),
		"events/s", totals[0].rate(), "the same projection with one cursor", totals[1].rate())}, nil
}

// partitionsCatchUp rewinds the partitioned projection, empties its table
// and drains its partitions in parallel until n events were delivered.
func partitionsCatchUp(ctx context.Context, pool *pgxpool.Pool, d *dispatcher.Dispatcher, n int) (int64, error) {
	if _, err := pool.Exec(ctx, `TRUNCATE bench_parted;
UPDATE event_consumers SET cursor_commit_key = '0', cursor_position = 0 WHERE name LIKE 'bench:parted@%'`); err != nil {
		return 0, err
	}
	var mu sync.Mutex
	var got int64
	var firstErr error
	var wg sync.WaitGroup
	for i := range benchPartitionCount {
		wg.Go(func() {
			for {
				k, err := d.RunOnce(ctx, dispatcher.PartitionName("bench:parted", i))
				mu.Lock()
				got += int64(k)
				if err != nil && firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				if err != nil || k == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	if got != int64(n) {
		return 0, fmt.Errorf("partitions delivered %d of %d events", got, n)
	}
	return got, nil
}
