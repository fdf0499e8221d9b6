package dispatcher_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// TestLostPassIsNoFailureOfItsEvent: when the pass's connection is ended
// under a handler (pg_terminate_backend, a failover) or the database picks
// the pass's transaction as a deadlock or serialization victim, the event
// did nothing wrong: it is retried, not counted as an attempt and never
// dead-lettered. Before, a SkipApplyErrors projection moved past the
// event (its effect lost for good), and a strict one counted the attempt
// (MaxAttempts 1: dead).
func TestLostPassIsNoFailureOfItsEvent(t *testing.T) {
	t.Parallel()
	var killed, deadlocked atomic.Bool
	b := setup(t, func(b *bundle) {
		kill := framework.MultiStreamProjection(b.f, "kill", &framework.ProjectionOptions{SkipApplyErrors: true})
		framework.On(kill, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if e.Payload.N == 1 && killed.CompareAndSwap(false, true) {
				var pid int
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				// An operator (or a failover) ends the pass's connection.
				if _, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'kill', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
		victim := framework.MultiStreamProjection(b.f, "victim", &framework.ProjectionOptions{MaxAttempts: 1})
		framework.On(victim, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if e.Payload.N == 1 && deadlocked.CompareAndSwap(false, true) {
				// What the server answers the victim of a deadlock.
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$`)
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'victim', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
	})
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, RetryMaxDelay: 5 * time.Millisecond})
	b.write(t, "t1", 0, 3, 3)

	last := count(t, b, `SELECT max(position) FROM events`)
	for _, name := range []string{"test:kill", "test:victim"} {
		deadline := time.Now().Add(20 * time.Second)
		for {
			st := state(t, b, name, dispatcher.SharedInstance)
			require.Equal(t, "idle", st.status, "%s: %+v", name, st)
			if st.position == int64(last) {
				break
			}
			require.True(t, time.Now().Before(deadline), "%s: %+v", name, st)
			if _, err := d.RunOnce(context.Background(), name); err != nil {
				t.Logf("%s: %v", name, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
		short := name[len("test:"):]
		require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = $1`, name), "%s dead-lettered an event", name)
		require.Equal(t, 3, count(t, b, `SELECT count(*) FROM seen WHERE consumer = $1`, short), "%s lost an event's effect", name)
		require.Equal(t, 3, count(t, b, `SELECT count(DISTINCT n) FROM seen WHERE consumer = $1`, short))
	}
	require.True(t, killed.Load())
	require.True(t, deadlocked.Load())
}

// TestLostPassIsNoFailureInLogsAndMetrics: a pass lost under a handler (a
// failover ends its connection, the database picks it as a deadlock
// victim) is routine and retried without counting an attempt, so it must
// not read as the event's failure: no "consumer event failed" line and no
// increment of kumiko_event_consumer_events_failed_total, on which alerts
// fire. It stays visible: a warning of its own, a counter of lost passes,
// and the state row's last error says the pass was lost.
func TestLostPassIsNoFailureInLogsAndMetrics(t *testing.T) {
	t.Parallel()
	var killed, deadlocked atomic.Bool
	b := setup(t, func(b *bundle) {
		kill := framework.MultiStreamProjection(b.f, "kill", nil)
		framework.On(kill, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if killed.CompareAndSwap(false, true) {
				var pid int
				if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				_, err := b.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, pid)
				if err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'kill', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
		victim := framework.MultiStreamProjection(b.f, "victim", nil)
		framework.On(victim, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if deadlocked.CompareAndSwap(false, true) {
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$`)
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'victim', $2, $3, '', '')`, tx.TenantID(), e.ID, e.Payload.N)
			return err
		})
	})
	reg := prometheus.NewRegistry()
	logs := &proctest.Buffer{}
	d := newDispatcher(t, b, &dispatcher.Config{Metrics: reg, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		RetryBaseDelay: time.Hour, RetryMaxDelay: time.Hour})
	b.write(t, "t1", 0, 1, 1)
	b.db.WaitVisible(t)

	for _, name := range []string{"test:kill", "test:victim"} {
		n, err := d.RunOnce(context.Background(), name)
		require.NoError(t, err, name)
		require.Zero(t, n, name)
		st := status(t, b, name, "")
		require.Equal(t, dispatcher.StateIdle, st.Status, name)
		require.Zero(t, st.Attempts, name)
		require.NotNil(t, st.FailedPosition, name)
		require.True(t, strings.HasPrefix(st.LastError, dispatcher.PassLost+": "), "%s: %q", name, st.LastError)
	}
	require.Contains(t, status(t, b, "test:victim", "").LastError, "deadlock detected")

	requireLines(t, scrape(t, reg),
		`kumiko_event_consumer_events_failed_total{consumer="test:kill",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_events_failed_total{consumer="test:victim",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_passes_lost_total{consumer="test:kill",instance_id="__shared__"} 1`,
		`kumiko_event_consumer_passes_lost_total{consumer="test:victim",instance_id="__shared__"} 1`,
	)
	lost := map[string]bool{}
	for line := range strings.Lines(logs.String()) {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec))
		require.NotEqual(t, "consumer event failed", rec["msg"], line)
		if rec["msg"] == "consumer pass lost; retrying its event" {
			require.Equal(t, "WARN", rec["level"], line)
			require.Equal(t, "test:event:noted", rec["event_type"], line)
			require.NotEmpty(t, rec["error"], line)
			lost[rec["consumer"].(string)] = true
		}
	}
	require.Equal(t, map[string]bool{"test:kill": true, "test:victim": true}, lost, logs.String())
}
