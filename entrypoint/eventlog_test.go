package entrypoint_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// restoredLogAhead appends one event and moves its commit key ahead of the
// server's transaction ids, as a dump restored into a new cluster leaves
// it (by a superuser UPDATE); it returns the key's epoch.
func restoredLogAhead(t *testing.T, db *kumikotest.DB) uint64 {
	t.Helper()
	ctx := context.Background()
	_, err := eventstore.Append(ctx, db.Pool, eventstore.StreamRef{TenantID: "acme", Type: "thing", ID: "1"}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: "restored:event:made", TypeVersion: 1, Payload: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	var next uint64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())`).Scan(&next))
	epoch := next>>32 + 2
	_, err = db.Pool.Exec(ctx, `UPDATE events SET commit_key = $1::text::xid8`, fmt.Sprint(epoch<<32|5))
	require.NoError(t, err)
	return epoch
}

// TestEventLogAheadIsReported: when the log's commit keys are ahead of the
// server's transaction ids (a dump restored into a new cluster, simulated
// by a superuser UPDATE), boot logs an ERROR and /health/ready answers 503
// with the check event_log naming the pg_resetwal that repairs it. Writes
// are paused meanwhile (an event appended then would never be delivered)
// and resume once the log is repaired.
func TestEventLogAheadIsReported(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	epoch := restoredLogAhead(t, db)
	fix := fmt.Sprintf("pg_resetwal -e %d ", epoch+1)

	rds := jobstest.StartRedis(t)
	logs := &proctest.Buffer{}
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register,
		Logger: slog.New(slog.NewJSONHandler(logs, nil)), EventLogCheckInterval: 50 * time.Millisecond})
	deadline := time.Now().Add(wait)
	for !strings.Contains(logs.String(), `"level":"ERROR","msg":"event log ahead of transaction ids`) {
		require.True(t, time.Now().Before(deadline), "no boot ERROR; logs:\n%s", logs.String())
		time.Sleep(20 * time.Millisecond)
	}
	require.Contains(t, logs.String(), fix)

	// The other checks pass once the process has started (the live
	// stream positions itself meanwhile); event_log alone keeps failing.
	for {
		reqCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
		code, body, err := get(reqCtx, s.url+"/health/ready")
		cancel()
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
		var r struct {
			State  string             `json:"state"`
			Checks []entrypoint.Check `json:"checks"`
		}
		require.NoError(t, json.Unmarshal(body, &r))
		var failed []string
		for _, c := range r.Checks {
			if !c.OK {
				failed = append(failed, c.Name)
			}
			if c.Name == "event_log" {
				require.False(t, c.OK, "%s", body)
				require.Contains(t, c.Error, fix)
			}
		}
		if r.State == "ready" && len(failed) == 1 && failed[0] == "event_log" {
			break
		}
		require.True(t, time.Now().Before(deadline), "not ready but for event_log: %s", body)
		time.Sleep(20 * time.Millisecond)
	}

	place := map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 100}}
	code, body, err := post(ctx, t, s.url+"/api/write", "acme", place)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
	require.Contains(t, string(body), `"code":"unavailable"`)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n))
	require.Equal(t, 1, n, "nothing written while paused")

	// The repair (here: the key back below the transaction ids).
	_, err = db.Pool.Exec(ctx, `UPDATE events SET commit_key = '3'`)
	require.NoError(t, err)
	for {
		code, body, err = post(ctx, t, s.url+"/api/write", "acme", place)
		require.NoError(t, err)
		if code == http.StatusOK {
			break
		}
		require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
		require.True(t, time.Now().Before(deadline.Add(wait)), "writes did not resume")
		time.Sleep(20 * time.Millisecond)
	}
	require.Contains(t, logs.String(), "event log repaired: writes resumed")
}

// TestEventLogUncheckedPausesWrites: when the boot check of the event log
// cannot answer (here it waits on a lock of the events table until its
// budget runs out, as it would on an unreachable or stalled database),
// writes stay paused until a check answers; they must not go through for a
// whole check interval, since on a restored log an event appended then
// would never be delivered.
func TestEventLogUncheckedPausesWrites(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	restoredLogAhead(t, db)

	lock, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `LOCK TABLE events IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	rds := jobstest.StartRedis(t)
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
	s := serve(t, entrypoint.Options{Config: cfg, Register: features.Register, EventLogCheckInterval: time.Hour})

	// The boot check waits on the lock, then gives up.
	checking := func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
  AND query LIKE '%SELECT commit_key FROM events ORDER BY%'`).Scan(&n))
		return n > 0
	}
	deadline := time.Now().Add(wait)
	for !checking() {
		require.True(t, time.Now().Before(deadline), "the boot check never ran")
		time.Sleep(10 * time.Millisecond)
	}
	for checking() {
		require.True(t, time.Now().Before(deadline), "the boot check did not give up")
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, lock.Rollback(ctx))

	place := map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 100}}
	code, body, err := post(ctx, t, s.url+"/api/write", "acme", place)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n))
	require.Equal(t, 1, n, "nothing written before the log was checked")
}
