package dispatcher_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// queuer is a projection that writes every event with tx.Queue, so a pass
// sends its writes in one pipeline with the COMMIT.
func queuer(b *bundle, name string, failN *atomic.Int64, readBack bool) {
	p := framework.MultiStreamProjection(b.f, name, nil)
	framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
		n := e.Payload.N
		if failN != nil && int64(n) == failN.Load() {
			// Fails in the database (row-level security refuses a NULL tenant),
			// not in Go: the pass only
			// learns it when the deferred statement runs.
			return tx.Queue(ctx, `INSERT INTO seen VALUES (NULL, $1, $2, $3, '', '')`, name, e.ID, n)
		}
		if err := tx.Queue(ctx, `INSERT INTO seen VALUES ($1, $2, $3, $4, $5, $6)`, tx.TenantID(), name, e.ID, n, tx.CausationID(), tx.CorrelationID()); err != nil {
			return err
		}
		if readBack {
			// A later statement sees the deferred write.
			var got int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM seen WHERE consumer = $1 AND position = $2`, name, e.ID).Scan(&got); err != nil {
				return err
			}
			if got != 1 {
				return fmt.Errorf("deferred write of %d not visible", e.ID)
			}
		}
		return nil
	})
}

func TestQueuedWritesCommitWithTheCursorInTheirTenants(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		queuer(b, "q", nil, false)
		queuer(b, "qr", nil, true)
	})
	d := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 20, 3)
	b.write(t, "t2", 20, 20, 3)
	b.write(t, "t1", 40, 10, 3)
	drain(t, d, "test:q", 50)
	drain(t, d, "test:qr", 50)
	// Row-level security's WITH CHECK would refuse a row in the wrong scope.
	require.Equal(t, 30, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'q' AND tenant_id = 't1'`))
	require.Equal(t, 20, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'q' AND tenant_id = 't2'`))
	require.Equal(t, 50, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'qr'`))
	require.Equal(t, 50, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'q' AND causation = position::text`))
}

func TestFailingQueuedWriteIsAttributedToItsEvent(t *testing.T) {
	t.Parallel()
	var failN atomic.Int64
	failN.Store(7)
	b := setup(t, func(b *bundle) { queuer(b, "q", &failN, false) })
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond})
	b.write(t, "t1", 0, 12, 2)
	// All visible, so that the pass reaches the failing event.
	b.db.WaitVisible(t)
	drain(t, d, "test:q", 7) // events 0..6 commit; 7 fails
	require.Equal(t, 7, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'q'`))
	st := state(t, b, "test:q", dispatcher.SharedInstance)
	require.Equal(t, 1, st.attempts)
	require.NotNil(t, st.lastErr)
	require.Contains(t, *st.lastErr, "row-level security")
	var failed int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT failed_position FROM event_consumers WHERE name = 'test:q'`).Scan(&failed))
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT (payload->>'n')::int FROM events WHERE position = $1`, failed).Scan(&n))
	require.Equal(t, 7, n, "the failure names the event whose deferred write failed")

	failN.Store(-1)
	time.Sleep(5 * time.Millisecond)
	drain(t, d, "test:q", 5)
	require.Equal(t, 12, count(t, b, `SELECT count(DISTINCT n) FROM seen WHERE consumer = 'q'`))
	require.Equal(t, 12, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'q'`))
}

// A deferred statement that fails in the database is blamed on its event
// even when a later event's handler returns an error before anything sent
// it: the first attempt blames the later event, and the re-run, whose
// statements run at once, finds the earlier failure and records that one.
// (Before, every pass gave up on that re-run: no attempt counted, the
// consumer never turned dead, and never moved again.)
func TestFailingQueuedWriteBeforeAFailingHandlerIsAttributedToItsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		p := framework.MultiStreamProjection(b.f, "q", &framework.ProjectionOptions{MaxAttempts: 2})
		framework.On(p, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			switch e.Payload.N {
			case 3: // fails in the database (row-level security refuses a NULL tenant)
				return tx.Queue(ctx, `INSERT INTO seen VALUES (NULL, 'q', $1, $2, '', '')`, e.ID, e.Payload.N)
			case 4: // fails in Go, before any statement sent event 3's
				return errors.New("go-side failure")
			}
			return tx.Queue(ctx, `INSERT INTO seen VALUES ($1, 'q', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
		})
	})
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond})
	b.write(t, "t1", 0, 6, 1)
	b.db.WaitVisible(t)
	failedN := func() int {
		t.Helper()
		return count(t, b, `SELECT (e.payload->>'n')::int FROM event_consumers c JOIN events e ON e.position = c.failed_position WHERE c.name = 'test:q'`)
	}

	n, err := d.RunOnce(context.Background(), "test:q")
	require.NoError(t, err)
	require.Equal(t, 3, n, "events 0 to 2 commit")
	st := state(t, b, "test:q", dispatcher.SharedInstance)
	require.Equal(t, 1, st.attempts)
	require.NotNil(t, st.lastErr)
	require.Contains(t, *st.lastErr, "row-level security")
	require.Equal(t, 3, failedN(), "the failure names the event whose deferred write failed")

	deadline := time.Now().Add(20 * time.Second)
	for state(t, b, "test:q", dispatcher.SharedInstance).status != "dead" {
		require.True(t, time.Now().Before(deadline), "never dead with MaxAttempts 2")
		_, err := d.RunOnce(context.Background(), "test:q")
		require.NoError(t, err)
		time.Sleep(2 * time.Millisecond)
	}
	require.Equal(t, 2, state(t, b, "test:q", dispatcher.SharedInstance).attempts)
	require.Equal(t, 3, failedN())
	require.Equal(t, 3, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'q'`))
}
