package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/cmd/kumiko/internal/e2e"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// writerPool opens a pool of n connections on db for the test's writers.
func writerPool(t *testing.T, db *kumikotest.DB, n int32) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	pc.MaxConns = n
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// e2eRuntime is a runtime with the e2e feature on pool (the writers' side;
// the processes register the same feature).
func e2eRuntime(t *testing.T, pool *pgxpool.Pool) (*framework.Runtime, *e2e.Feature) {
	t.Helper()
	reg := framework.NewRegistry()
	ft := e2e.Register(reg, e2e.Options{})
	rt, err := framework.NewRuntime(reg, pool, nil)
	require.NoError(t, err)
	return rt, ft
}

// setupE2E gives a test a fresh database with the e2e tables and a private
// Redis.
func setupE2E(t *testing.T) (*kumikotest.DB, string) {
	t.Helper()
	db := kumikotest.NewDB(t)
	_, err := db.Pool.Exec(context.Background(), e2e.Schema)
	require.NoError(t, err)
	return db, jobstest.StartRedis(t).URL
}

// tick appends n e2e events, one per transaction, alternating tenants.
func tick(t *testing.T, rt *framework.Runtime, ft *e2e.Feature, n int) {
	t.Helper()
	for i := range n {
		tenant := []string{"acme", "globex"}[i%2]
		_, err := rt.InTx(context.Background(), tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: e2e.StreamType, ID: strconv.Itoa(i % 7)}, framework.AnyVersion,
				ft.Ticked.With(e2e.Ticked{Seq: int64(i)}))
		})
		require.NoError(t, err)
	}
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// TestSharedConsumerExactlyOnceAcrossProcesses runs two worker processes
// of the real kumiko binary on one database while orders are placed: the
// shared projection orders:order-totals (one row per customer, an order
// count per row) applies every placed event exactly once between them.
func TestSharedConsumerExactlyOnceAcrossProcesses(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	redisURL := jobstest.StartRedis(t).URL
	w1 := start(t, kumikoBin, "worker-1", processEnv(t, "worker", db, redisURL, "worker-1"))
	w2 := start(t, kumikoBin, "worker-2", processEnv(t, "worker", db, redisURL, "worker-2"))

	reg := framework.NewRegistry()
	features.Register(reg)
	rt, err := framework.NewRuntime(reg, writerPool(t, db, 8), nil)
	require.NoError(t, err)
	const writers, perWriter = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				payload, _ := json.Marshal(map[string]any{"customer": fmt.Sprintf("c-%d-%d", w, i), "amountCents": 100})
				call := framework.Call{Principal: framework.Principal{UserID: "writer", TenantID: []string{"acme", "globex"}[w%2]}, RequestID: fmt.Sprintf("r-%d-%d", w, i)}
				if _, err := rt.Write(context.Background(), call, []framework.Command{{Type: "orders:write:place", Payload: payload}}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	const total = writers * perWriter
	require.EqualValues(t, total, queryInt(t, db.Pool, `SELECT count(*) FROM events WHERE type = 'orders:event:placed'`))
	waitUntil(t, "order totals", []*proc{w1, w2}, func() (bool, string) {
		n := queryInt(t, db.Pool, `SELECT coalesce(sum(orders), 0) FROM order_totals`)
		return n >= total, fmt.Sprintf("%d of %d orders counted", n, total)
	})
	// One row per customer, each counted once: no event applied twice.
	require.EqualValues(t, total, queryInt(t, db.Pool, `SELECT count(*) FROM order_totals`))
	require.EqualValues(t, 1, queryInt(t, db.Pool, `SELECT max(orders) FROM order_totals`))
	require.EqualValues(t, total, queryInt(t, db.Pool, `SELECT coalesce(sum(orders), 0) FROM order_totals`))
	require.EqualValues(t, total, queryInt(t, db.Pool,
		`SELECT events_processed FROM event_consumers WHERE name = 'orders:order-totals' AND instance_id = '__shared__'`))
}

// TestPerInstanceConsumerDeliversEveryEventInEveryProcess runs two API
// processes: the per-instance projection e2e:local applies every event once
// in each of them, and the worker-only shared projection in neither.
func TestPerInstanceConsumerDeliversEveryEventInEveryProcess(t *testing.T) {
	t.Parallel()
	db, redisURL := setupE2E(t)
	procs := []*proc{
		start(t, e2eBin, "api-1", processEnv(t, "api", db, redisURL, "api-1")),
		start(t, e2eBin, "api-2", processEnv(t, "api", db, redisURL, "api-2")),
	}
	rt, ft := e2eRuntime(t, writerPool(t, db, 4))
	const n = 300
	tick(t, rt, ft, n)
	waitUntil(t, "per-instance delivery", procs, func() (bool, string) {
		a := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_local WHERE instance_id = 'api-1'`)
		b := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_local WHERE instance_id = 'api-2'`)
		return a >= n && b >= n, fmt.Sprintf("api-1 %d, api-2 %d of %d", a, b, n)
	})
	for _, inst := range []string{"api-1", "api-2"} {
		// Exactly the log's events, each once.
		require.EqualValues(t, n, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_local WHERE instance_id = $1`, inst), inst)
		require.EqualValues(t, 0, queryInt(t, db.Pool, `SELECT count(*) FROM (
  SELECT position FROM events WHERE type = 'e2e:event:ticked'
  EXCEPT SELECT position FROM e2e_local WHERE instance_id = $1) missing`, inst), inst)
		require.EqualValues(t, n, queryInt(t, db.Pool, `SELECT count(DISTINCT position) FROM e2e_local WHERE instance_id = $1`, inst), inst)
		require.EqualValues(t, n, queryInt(t, db.Pool,
			`SELECT events_processed FROM event_consumers WHERE name = 'e2e:local' AND instance_id = $1`, inst), inst)
	}
	require.Zero(t, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`), "API processes run no worker-only shared consumer")
}

// heldBy returns the application_name (the instance id) of the backend that
// holds the pass lock of a shared consumer, or "".
func heldBy(t *testing.T, pool *pgxpool.Pool, consumer string) string {
	t.Helper()
	var app string
	err := pool.QueryRow(context.Background(), `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1 || chr(31) || '__shared__', 0)`, consumer).Scan(&app)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return app
}

// TestSIGKILLMidPassLosesAndDuplicatesNothing kills the worker process
// that is in the middle of a pass of e2e:tally (its handler sleeps per
// event, so a pass of 500 events takes a second) after at least one pass
// committed; the surviving worker finishes the log: every event applied
// once, none lost, none twice.
func TestSIGKILLMidPassLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	db, redisURL := setupE2E(t)
	rt, ft := e2eRuntime(t, writerPool(t, db, 4))
	const n = 1500
	tick(t, rt, ft, n)
	workers := map[string]*proc{}
	for _, name := range []string{"worker-a", "worker-b"} {
		workers[name] = start(t, e2eBin, name, processEnv(t, "worker", db, redisURL, name, "E2E_APPLY_DELAY_MS", "2"))
	}
	all := []*proc{workers["worker-a"], workers["worker-b"]}

	var victim string
	waitUntil(t, "a pass in progress after a committed one", all, func() (bool, string) {
		done := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`)
		holder := heldBy(t, db.Pool, "e2e:tally")
		if done > 0 && done < n-500 && holder != "" {
			victim = holder
			return true, ""
		}
		return false, fmt.Sprintf("%d of %d applied, lock held by %q", done, n, holder)
	})
	before := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`)
	workers[victim].kill()
	require.False(t, workers[victim].alive())
	t.Logf("killed %s mid-pass with %d of %d events applied", victim, before, n)

	survivor := workers["worker-a"]
	if victim == "worker-a" {
		survivor = workers["worker-b"]
	}
	waitUntil(t, "the survivor to finish", []*proc{survivor}, func() (bool, string) {
		done := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`)
		return done >= n, fmt.Sprintf("%d of %d applied", done, n)
	})
	require.EqualValues(t, n, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`), "no event applied twice")
	require.EqualValues(t, n, queryInt(t, db.Pool, `SELECT count(DISTINCT position) FROM e2e_tally`))
	require.EqualValues(t, 0, queryInt(t, db.Pool, `SELECT count(*) FROM (
  SELECT position FROM events WHERE type = 'e2e:event:ticked' EXCEPT SELECT position FROM e2e_tally) missing`), "no event lost")
	require.Positive(t, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally WHERE instance_id = $1`, survivor.name))
	require.EqualValues(t, n, queryInt(t, db.Pool,
		`SELECT events_processed FROM event_consumers WHERE name = 'e2e:tally' AND instance_id = '__shared__'`))
	require.True(t, survivor.alive())
}

// streamTotals is what the writers committed to one stream.
type streamTotals struct {
	events int64
	seqSum int64
}

// TestGaplessEndToEnd: 32 writers append about 50k events to shared
// streams of two tenants while two worker processes dispatch them. A
// quarter of the writers take their transaction id early and commit late
// (the case an id > cursor reader loses events in), some transactions roll
// back. e2e:streams runs in partitions, so the two workers deliver its
// streams in parallel. Afterwards the e2e:streams projection equals a
// recount from the events table and the writers' own record, no stream saw
// a version out of order, and e2e:tally holds every event once.
func TestGaplessEndToEnd(t *testing.T) {
	t.Parallel()
	db, redisURL := setupE2E(t)
	procs := []*proc{
		start(t, e2eBin, "worker-1", processEnv(t, "worker", db, redisURL, "worker-1")),
		start(t, e2eBin, "worker-2", processEnv(t, "worker", db, redisURL, "worker-2")),
	}
	// 32 writer goroutines share 24 connections (the server's connection
	// limit is shared with other test packages).
	rt, ft := e2eRuntime(t, writerPool(t, db, 24))
	const (
		writers  = 32
		target   = 50_000
		nStreams = 48
	)
	var (
		committed atomic.Int64
		seq       atomic.Int64
		mu        sync.Mutex
		want      = map[string]*streamTotals{}
		errs      = make(chan error, writers)
		wg        sync.WaitGroup
	)
	errRollback := errors.New("rolled back on purpose")
	for w := range writers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			tenant := []string{"acme", "globex"}[w%2]
			early := w%4 == 0
			for committed.Load() < target {
				n := 1 + rnd.IntN(6)
				f := rnd.IntN(nStreams)
				first, second := strconv.Itoa(f), strconv.Itoa((f+1+rnd.IntN(nStreams-1))%nStreams)
				if early && rnd.IntN(2) == 0 {
					// Streams of its own: the events keep the writer's
					// early xid as commit key, below keys of younger
					// transactions that commit first.
					f = rnd.IntN(4)
					first, second = fmt.Sprintf("p%d-%d", w, f), fmt.Sprintf("p%d-%d", w, (f+1)%4)
				}
				split := rnd.IntN(n + 1)
				rollback := rnd.IntN(20) == 0
				local := map[string]*streamTotals{}
				_, err := rt.InTx(context.Background(), tenant, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
					clear(local)
					if early {
						// Take the xid now; append and commit later.
						if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
							return err
						}
						time.Sleep(time.Duration(rnd.IntN(6)) * time.Millisecond)
					}
					for i := range n {
						stream := first
						if i >= split {
							stream = second
						}
						s := seq.Add(1)
						if err := tx.Append(framework.Stream{Type: e2e.StreamType, ID: stream}, framework.AnyVersion,
							ft.Ticked.With(e2e.Ticked{Writer: w, Seq: s})); err != nil {
							return err
						}
						if local[stream] == nil {
							local[stream] = &streamTotals{}
						}
						local[stream].events++
						local[stream].seqSum += s
					}
					if early {
						// The events are written; the commit comes late.
						if _, err := tx.Flush(ctx); err != nil {
							return err
						}
						time.Sleep(time.Duration(rnd.IntN(6)) * time.Millisecond)
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if errors.Is(err, errRollback) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				committed.Add(int64(n))
				mu.Lock()
				for s, lt := range local {
					key := tenant + "/" + s
					if want[key] == nil {
						want[key] = &streamTotals{}
					}
					want[key].events += lt.events
					want[key].seqSum += lt.seqSum
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	total := committed.Load()
	require.EqualValues(t, total, queryInt(t, db.Pool, `SELECT count(*) FROM events WHERE type = 'e2e:event:ticked'`))
	t.Logf("%d events committed by %d writers", total, writers)

	// Wait until no cursor of either projection (e2e:streams runs in
	// partitions) has an event of its share of the log after it.
	waitUntil(t, "the projections to reach the end of the log", procs, func() (bool, string) {
		var rows, behind int64
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE EXISTS (
    SELECT 1 FROM events e WHERE (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
      AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index)))
FROM event_consumers c
WHERE (c.name = 'e2e:tally' OR c.name LIKE 'e2e:streams@%') AND c.instance_id = '__shared__'`).Scan(&rows, &behind))
		p := queryInt(t, db.Pool, `SELECT coalesce(sum(events), 0) FROM e2e_streams`)
		tl := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`)
		return rows == 1+e2e.StreamsPartitions && behind == 0,
			fmt.Sprintf("streams %d, tally %d of %d events; %d of %d cursors behind", p, tl, total, behind, rows)
	})
	// Every partition of e2e:streams delivered a share.
	require.EqualValues(t, e2e.StreamsPartitions, queryInt(t, db.Pool, `SELECT count(*) FROM event_consumers
WHERE name LIKE 'e2e:streams@%' AND partition_count = $1 AND events_processed > 0`, e2e.StreamsPartitions))
	require.EqualValues(t, total, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`), "every event delivered")

	// The projection equals a recount from the events table, which equals
	// what the writers committed.
	type row struct {
		Tenant, Stream                     string
		Events, LastVersion, Seq, Disorder int64
	}
	collect := func(sql string) map[string]row {
		rows, err := db.Pool.Query(context.Background(), sql)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
		require.NoError(t, err)
		m := map[string]row{}
		for _, r := range got {
			m[r.Tenant+"/"+r.Stream] = r
		}
		return m
	}
	projected := collect(`SELECT tenant_id, stream_id, events, last_version, seq_sum, disorder FROM e2e_streams`)
	recount := collect(`SELECT tenant_id, stream_id, count(*), max(version), sum((payload->>'seq')::bigint), 0::bigint
FROM events WHERE type = 'e2e:event:ticked' GROUP BY tenant_id, stream_id`)
	var diffs []string
	for key, rc := range recount {
		pr, ok := projected[key]
		w := want[key]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: not projected (log %+v)", key, rc))
		case pr != rc:
			diffs = append(diffs, fmt.Sprintf("%s: projected %+v, log %+v", key, pr, rc))
		case w == nil || w.events != rc.Events || w.seqSum != rc.Seq:
			diffs = append(diffs, fmt.Sprintf("%s: log %+v, writers committed %+v", key, rc, w))
		case rc.Events != rc.LastVersion:
			diffs = append(diffs, fmt.Sprintf("%s: %d events up to version %d", key, rc.Events, rc.LastVersion))
		}
	}
	for key := range projected {
		if _, ok := recount[key]; !ok {
			diffs = append(diffs, key+": projected but not in the log")
		}
	}
	require.Len(t, recount, len(want), "streams in the log and streams the writers committed")
	require.Empty(t, diffs, "%d of %d streams differ", len(diffs), len(recount))
	require.EqualValues(t, total, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`), "each event applied once")
	require.EqualValues(t, total, queryInt(t, db.Pool, `SELECT count(DISTINCT position) FROM e2e_tally`))
	t.Logf("e2e:tally passes per process: %v", tallyByInstance(t, db.Pool))
}

// tallyByInstance counts e2e:tally rows per process.
func tallyByInstance(t *testing.T, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT instance_id, count(*) FROM e2e_tally GROUP BY 1`)
	require.NoError(t, err)
	type count struct {
		Instance string
		N        int64
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[count])
	require.NoError(t, err)
	out := map[string]int64{}
	for _, c := range got {
		out[c.Instance] = c.N
	}
	return out
}
