package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestKilledPassConnectionsLoseAndDuplicateNothing: while writers of three
// tenants commit out of id order (a third take their xid early; some hold
// their transaction open for hundreds of milliseconds, across many passes,
// while the others commit; some roll back), the dispatcher's connections
// are ended with pg_terminate_backend at random moments, mid-pass and
// mid-commit included. Afterwards every consumer (shared, partitioned,
// per-instance, one with SkipApplyErrors, a saga and the projection of the
// saga's events) has applied every committed event exactly once, in
// version order per stream, none was dead-lettered, and the saga appended
// exactly one event per source event.
func TestKilledPassConnectionsLoseAndDuplicateNothing(t *testing.T) {
	t.Parallel()
	type derived struct {
		Of int64 `json:"of"`
	}
	var der framework.EventType[derived]
	names := []string{"whole", "part", "inst", "skipper", "derivedlog"}
	b := setup(t, func(b *bundle) {
		_, err := b.db.Pool.Exec(context.Background(), `CREATE TABLE applied (tenant_id text NOT NULL, consumer text NOT NULL,
  position bigint NOT NULL, stream text NOT NULL, version bigint NOT NULL, seq bigserial);
SELECT kumiko_enable_tenancy('applied')`)
		require.NoError(t, err)
		der = framework.DefineEvent[derived](b.f, "derived", nil)
		record := func(name string, opts *framework.ProjectionOptions) {
			p := framework.MultiStreamProjection(b.f, name, opts)
			ins := func(ctx context.Context, tx *framework.Tx, id int64, s framework.Stream, v int64) error {
				_, err := tx.Exec(ctx, `INSERT INTO applied (tenant_id, consumer, position, stream, version) VALUES ($1, $2, $3, $4, $5)`,
					tx.TenantID(), name, id, s.Type+"/"+s.ID, v)
				return err
			}
			if name == "derivedlog" {
				framework.On(p, der, func(ctx context.Context, tx *framework.Tx, e framework.Event[derived]) error {
					return ins(ctx, tx, e.ID, e.Stream, e.Version)
				})
				return
			}
			framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
				return ins(ctx, tx, e.ID, e.Stream, e.Version)
			})
		}
		record("whole", nil)
		record("part", &framework.ProjectionOptions{Partitions: 3})
		record("inst", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
		record("skipper", &framework.ProjectionOptions{SkipApplyErrors: true})
		record("derivedlog", &framework.ProjectionOptions{Partitions: 2})
		saga := framework.MultiStreamProjection(b.f, "saga", &framework.ProjectionOptions{Saga: true})
		framework.On(saga, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			return tx.Append(framework.Stream{Type: "d", ID: e.Stream.ID}, framework.AnyVersion, der.With(derived{Of: e.ID}))
		})
	})
	ctx := context.Background()

	// The dispatcher's own pool, so that the killer ends only its
	// connections.
	cfg, err := pgxpool.ParseConfig(b.db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "kill-target"
	cfg.MaxConns = 6
	dpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(dpool.Close)
	d, err := dispatcher.New(dpool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil), &dispatcher.Config{
		InstanceID: "kill-instance", PollInterval: 10 * time.Millisecond, BatchSize: 40, MaxConcurrentPasses: 3,
		HeartbeatInterval: time.Hour, // no stale sweep: one instance
	})
	require.NoError(t, err)
	runCtx, stopRun := context.WithCancel(ctx)
	var runWG sync.WaitGroup
	runWG.Go(func() { _ = d.Run(runCtx) })
	t.Cleanup(func() { stopRun(); runWG.Wait() })

	// Writers.
	const writers, perWriter = 6, 70
	errRollback := errors.New("rolled back on purpose")
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	var rolledBack atomic.Int64
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			tenant := []string{"acme", "globex", "initech"}[w%3]
			for i := range perWriter {
				early := rng.IntN(3) == 0
				hold := time.Duration(rng.IntN(3)) * time.Millisecond
				if rng.IntN(25) == 0 {
					hold = time.Duration(300+rng.IntN(500)) * time.Millisecond // across many passes
				}
				rollback := rng.IntN(10) == 0
				n := 1 + rng.IntN(3)
				_, err := b.rt.InTx(ctx, tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
					if early {
						if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
							return err
						}
					}
					time.Sleep(hold)
					for k := range n {
						s := framework.Stream{Type: "s", ID: fmt.Sprint(rng.IntN(12))}
						if err := tx.Append(s, framework.AnyVersion, b.noted.With(noted{N: w*1000 + i*10 + k})); err != nil {
							return err
						}
					}
					if _, err := tx.Flush(ctx); err != nil {
						return err
					}
					if early {
						time.Sleep(time.Duration(rng.IntN(4)) * time.Millisecond) // commit late
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if errors.Is(err, errRollback) {
					rolledBack.Add(int64(n))
					continue
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}

	// The killer.
	killCtx, stopKill := context.WithCancel(ctx)
	var kills atomic.Int64
	var killWG sync.WaitGroup
	killWG.Go(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		for killCtx.Err() == nil {
			time.Sleep(time.Duration(20+rng.IntN(120)) * time.Millisecond)
			var n int
			// Mostly a connection in a pass (in a transaction, or
			// running a statement), sometimes any of them.
			q := `SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = 'kill-target'
    AND ($1 OR state IN ('active', 'idle in transaction', 'idle in transaction (aborted)'))
  ORDER BY random() LIMIT 1) x`
			if err := b.db.Pool.QueryRow(ctx, q, rng.IntN(4) == 0).Scan(&n); err == nil {
				kills.Add(int64(n))
			}
		}
	})

	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// Keep killing a little while the backlog drains.
	time.Sleep(500 * time.Millisecond)
	stopKill()
	killWG.Wait()
	t.Logf("killed %d dispatcher connections, %d events rolled back", kills.Load(), rolledBack.Load())
	require.Positive(t, kills.Load())

	nNoted := count(t, b, `SELECT count(*) FROM events WHERE type = 'test:event:noted'`)
	require.Positive(t, nNoted)
	waitCount(t, b, `SELECT count(*) FROM events WHERE type = 'test:event:derived'`, nNoted, 60*time.Second)
	for _, name := range names {
		waitCount(t, b, fmt.Sprintf(`SELECT count(*) FROM applied WHERE consumer = '%s'`, name), nNoted, 60*time.Second)
	}
	// The saga: one derived event per noted event.
	require.Equal(t, nNoted, count(t, b, `SELECT count(DISTINCT payload->>'of') FROM events WHERE type = 'test:event:derived'`))
	require.Zero(t, count(t, b, `SELECT count(*) FROM events n WHERE n.type = 'test:event:noted'
  AND NOT EXISTS (SELECT 1 FROM events d WHERE d.type = 'test:event:derived' AND (d.payload->>'of')::bigint = n.position)`))
	for _, name := range names {
		typ := "test:event:noted"
		if name == "derivedlog" {
			typ = "test:event:derived"
		}
		// Exactly the committed events, each once.
		require.Zero(t, count(t, b, `SELECT count(*) FROM (SELECT position FROM applied WHERE consumer = $1 GROUP BY position HAVING count(*) > 1) x`, name),
			"%s applied an event twice", name)
		require.Zero(t, count(t, b, `SELECT count(*) FROM events e WHERE e.type = $2
  AND NOT EXISTS (SELECT 1 FROM applied a WHERE a.consumer = $1 AND a.position = e.position)`, name, typ), "%s lost an event", name)
		// Versions in order per stream, in the order the consumer applied them.
		require.Zero(t, count(t, b, `SELECT count(*) FROM (
  SELECT version, lag(version) OVER (PARTITION BY tenant_id, stream ORDER BY seq) AS prev FROM applied WHERE consumer = $1) x
WHERE prev IS NOT NULL AND version <> prev + 1`, name), "%s applied a stream out of order", name)
	}
	var stuck []string
	rows, err := b.db.Pool.Query(ctx, `SELECT name || ' ' || status || ' ' || attempts FROM event_consumers WHERE status <> 'idle' OR attempts > 0`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		stuck = append(stuck, s)
	}
	require.NoError(t, rows.Err())
	require.Empty(t, stuck)
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters`))
}
