package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/cmd/kumiko/internal/e2e"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// cli runs `bin args...` with env to its end and returns its exit code and
// output.
func cli(t *testing.T, bin, name string, env map[string]string, args ...string) (int, string) {
	t.Helper()
	p := proctest.Start(t, bin, name, env, args...)
	select {
	case <-p.Exited():
	case <-time.After(deadline):
		t.Fatalf("%s did not end within %s: %s", name, deadline, p.Output.String())
	}
	return p.Code(), p.Output.String()
}

// TestRebuildKilledThenRerun: `kumiko projection rebuild` is killed with
// SIGKILL in the middle of its replay while a worker runs the live
// consumer and writers keep appending. What it leaves (the shadow schema,
// the #rebuild consumer row) holds retention back; the next rebuild removes
// it, starts over and swaps in a table with every event exactly once, and
// the live consumer goes on from there without a gap or a duplicate.
func TestRebuildKilledThenRerun(t *testing.T) {
	t.Parallel()
	db, redisURL := setupE2E(t)
	rt, ft := e2eRuntime(t, writerPool(t, db, 4))
	tick(t, rt, ft, 600)
	worker := start(t, e2eBin, "worker", processEnv(t, "worker", db, redisURL, "worker"))
	waitUntil(t, "the live consumer to apply the history", []*proc{worker}, func() (bool, string) {
		n := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`)
		return n >= 600, fmt.Sprintf("%d of 600", n)
	})

	// Writers keep appending for the whole test.
	wctx, stop := context.WithCancel(context.Background())
	var writers sync.WaitGroup
	defer writers.Wait()
	defer stop()
	writers.Go(func() {
		for i := 0; wctx.Err() == nil; i++ {
			_, _ = rt.InTx(wctx, "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
				return tx.Append(framework.Stream{Type: e2e.StreamType, ID: fmt.Sprint("w", i%3)}, framework.AnyVersion,
					ft.Ticked.With(e2e.Ticked{Seq: int64(i)}))
			})
			time.Sleep(2 * time.Millisecond)
		}
	})

	env := processEnv(t, "worker", db, redisURL, "rebuilder", "E2E_APPLY_DELAY_MS", "3")
	victim := proctest.Start(t, e2eBin, "rebuild-1", env, "projection", "rebuild", "e2e:tally", "--batch-size", "20")
	waitUntil(t, "the rebuild to be under way", nil, func() (bool, string) {
		n := queryInt(t, db.Pool, `SELECT coalesce(max(events_processed), 0) FROM event_consumers WHERE name = 'e2e:tally#rebuild'`)
		return n >= 100 || !victim.Alive(), fmt.Sprintf("%d applied by the rebuild", n)
	})
	require.True(t, victim.Alive(), "the rebuild ended before it could be killed: %s", victim.Output.String())
	victim.Kill()
	schema := "kumiko_rebuild_%"
	require.EqualValues(t, 1, queryInt(t, db.Pool, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, schema), "the killed rebuild left its shadow schema")
	require.EqualValues(t, 1, queryInt(t, db.Pool, `SELECT count(*) FROM event_consumers WHERE name = 'e2e:tally#rebuild'`))

	// The leftover row holds retention back.
	_, err := db.Pool.Exec(context.Background(), `UPDATE events SET created_at = created_at - interval '2 days' WHERE position <= 300`)
	require.NoError(t, err)
	code, out := cli(t, e2eBin, "prune", env, "events", "prune", "--older-than-days", "1", "--types", "e2e:event:ticked")
	require.Equal(t, 1, code, out)
	require.Contains(t, out, "e2e:tally#rebuild")
	require.EqualValues(t, 600, queryInt(t, db.Pool, `SELECT count(*) FROM events WHERE position <= 600`), "nothing pruned")

	// The rerun removes the leftover and rebuilds.
	env["E2E_APPLY_DELAY_MS"] = "0"
	code, out = cli(t, e2eBin, "rebuild-2", env, "projection", "rebuild", "e2e:tally", "--batch-size", "50")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "removed the leftover of an earlier, interrupted rebuild", out)
	require.Zero(t, queryInt(t, db.Pool, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE $1`, schema))
	require.Zero(t, queryInt(t, db.Pool, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
	require.True(t, strings.Contains(out, "swapped in"), out)

	time.Sleep(200 * time.Millisecond)
	stop()
	writers.Wait()
	waitUntil(t, "the live consumer to catch up", []*proc{worker}, func() (bool, string) {
		n := queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally`)
		m := queryInt(t, db.Pool, `SELECT count(*) FROM events WHERE type = 'e2e:event:ticked'`)
		return n >= m, fmt.Sprintf("%d of %d", n, m)
	})
	require.Zero(t, queryInt(t, db.Pool, `SELECT count(*) FROM (SELECT position FROM e2e_tally GROUP BY position HAVING count(*) > 1) d`), "no event applied twice")
	require.Zero(t, queryInt(t, db.Pool, `SELECT count(*) FROM (SELECT position FROM events WHERE type = 'e2e:event:ticked' EXCEPT SELECT position FROM e2e_tally) m`), "no event lost")
	require.Positive(t, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally WHERE instance_id = 'rebuilder'`))
	require.Positive(t, queryInt(t, db.Pool, `SELECT count(*) FROM e2e_tally WHERE instance_id = 'worker'`), "the live consumer went on after the swap")
	require.True(t, worker.alive())
}
