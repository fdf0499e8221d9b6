package replica_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/replica"
	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// conflictInput asks the reader query to sleep on the standby while it
// holds its lock on conflict_probe, and to fail with a serialization
// failure (40001) when it runs on the primary.
type conflictInput struct {
	Sleep         bool `json:"sleep"`
	FailOnPrimary bool `json:"failOnPrimary"`
}

// TestRecoveryConflictRunsOnThePrimary makes the standby cancel a query
// for real: with max_standby_streaming_delay=0, replaying an ACCESS
// EXCLUSIVE lock taken on the primary cancels the standby's reader of
// that table at once ("canceling statement due to conflict with
// recovery", SQLSTATE 40001). That is no conflict of the client's: a
// query is read-only, so it runs once more on the primary and answers
// 200, counted as a recovery_conflict fallback and logged; the replica
// is healthy, so no cooldown starts. A 40001 of the primary stays the
// client's 409.
func TestRecoveryConflictRunsOnThePrimary(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "max_standby_streaming_delay=0")
	ctx := t.Context()
	primary := openPool(t, c.primary.URL("kumiko"))
	standby := openPool(t, c.standby.URL("kumiko"))

	_, err := primary.Exec(ctx, `CREATE TABLE conflict_probe (x int);
		INSERT INTO conflict_probe VALUES (1);
		GRANT SELECT ON conflict_probe TO kumiko_tenant;
		CREATE FUNCTION raise_serialization_failure() RETURNS void LANGUAGE plpgsql AS
		$$BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure'; END$$`)
	require.NoError(t, err)
	var lsn string
	require.NoError(t, primary.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn))
	require.Eventually(t, func() bool {
		var ok bool
		return standby.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&ok) == nil && ok
	}, 20*time.Second, 10*time.Millisecond, "the standby replays the table")

	reg := framework.NewRegistry()
	framework.Query(reg.Feature("replica-test"), "reader", func(ctx context.Context, tx *framework.Tx, in conflictInput) (probe, error) {
		var p probe
		if err := tx.QueryRow(ctx, `SELECT pg_is_in_recovery(), (SELECT count(*) FROM conflict_probe) > 0
			FROM pg_sleep(CASE WHEN $1 AND pg_is_in_recovery() THEN 30 ELSE 0 END)`, in.Sleep).Scan(&p.InRecovery, &p.Found); err != nil {
			return p, err
		}
		if in.FailOnPrimary && !p.InRecovery {
			_, err := tx.Exec(ctx, `SELECT raise_serialization_failure()`)
			return p, err
		}
		return p, nil
	}, nil)
	var logs proctest.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	router, err := replica.New(primary, standby, &replica.Config{Cooldown: time.Minute, Logger: logger, Metrics: prometheus.NewRegistry()})
	require.NoError(t, err)
	rt, err := framework.NewRuntime(reg, primary, &framework.RuntimeConfig{Logger: logger, ReadPool: standby, ReadRouter: router})
	require.NoError(t, err)
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	require.NoError(t, err)
	srv := httptest.NewServer(web.New(rt, keys, nil).Handler())
	t.Cleanup(srv.Close)
	tok, err := keys.Mint(auth.Principal{UserID: "alice", TenantID: "acme"}, time.Hour)
	require.NoError(t, err)

	type answer struct {
		status int
		body   []byte
	}
	query := func(in conflictInput) answer {
		raw, _ := json.Marshal(map[string]any{"type": "replica-test:query:reader", "payload": in})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/query", strings.NewReader(string(raw)))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		res, err := srv.Client().Do(req)
		if err != nil {
			return answer{body: []byte(err.Error())}
		}
		defer res.Body.Close()
		buf, _ := io.ReadAll(res.Body)
		return answer{res.StatusCode, buf}
	}
	standbyAdmin, err := pgx.Connect(ctx, c.standby.URL("kumiko"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = standbyAdmin.Close(context.Background()) })
	// conflict runs a sleeping reader on the standby and, once it sleeps
	// holding its lock, replays an ACCESS EXCLUSIVE lock on its table.
	conflict := func(in conflictInput) answer {
		in.Sleep = true
		done := make(chan answer, 1)
		go func() { done <- query(in) }()
		require.Eventually(t, func() bool {
			var n int
			return standbyAdmin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE query LIKE '%conflict_probe%' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()`).Scan(&n) == nil && n == 1
		}, 20*time.Second, 10*time.Millisecond, "the reader sleeps on the standby")
		require.NoError(t, pgx.BeginFunc(ctx, primary, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `LOCK TABLE conflict_probe IN ACCESS EXCLUSIVE MODE`)
			return err
		}))
		select {
		case a := <-done:
			return a
		case <-time.After(25 * time.Second):
			t.Fatal("the standby did not cancel the reader (its sleep is 30 s)")
			return answer{}
		}
	}

	// 1. The standby cancels the reader: it runs once more, on the primary.
	a := conflict(conflictInput{})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	var out struct{ Data probe }
	require.NoError(t, json.Unmarshal(a.body, &out))
	require.Equal(t, probe{Found: true, InRecovery: false}, out.Data, "answered by the primary")
	require.InDelta(t, 1, router.Fallbacks(replica.ReasonRecoveryConflict), 0)
	require.Zero(t, router.Fallbacks(replica.ReasonError), "a recovery conflict is no replica failure")
	require.Zero(t, router.Fallbacks(replica.ReasonLag))
	require.Contains(t, logs.String(), `"query":"replica-test:query:reader"`)
	require.Contains(t, logs.String(), "canceling statement due to conflict with recovery (SQLSTATE 40001)")
	require.Contains(t, logs.String(), "relation lock", "the log says which conflict (its DETAIL)")

	// 2. No cooldown: the next query is the standby's again.
	a = query(conflictInput{})
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.NoError(t, json.Unmarshal(a.body, &out))
	require.Equal(t, probe{Found: true, InRecovery: true}, out.Data, "served by the standby")

	// 3. A serialization failure of the primary is the client's 409, and
	// the query runs there once only.
	a = conflict(conflictInput{FailOnPrimary: true})
	require.Equal(t, http.StatusConflict, a.status, "%s", a.body)
	require.InDelta(t, 2, router.Fallbacks(replica.ReasonRecoveryConflict), 0)
	require.Zero(t, router.Fallbacks(replica.ReasonError))
}

// TestSerializationFailureOfAReadServerNotInRecovery: a read server that
// is not in recovery (a promoted standby, a primary as read server) has no
// recovery to conflict with, so its 40001 is a real serialization failure:
// the client's 409, with no second run and no fallback.
func TestSerializationFailureOfAReadServerNotInRecovery(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := t.Context()
	_, err := db.Pool.Exec(ctx, `
		CREATE FUNCTION raise_serialization_failure() RETURNS void LANGUAGE plpgsql AS
		$$BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure'; END$$`)
	require.NoError(t, err)
	var runs atomic.Int32
	reg := framework.NewRegistry()
	framework.Query(reg.Feature("replica-test"), "serialization", func(ctx context.Context, tx *framework.Tx, _ struct{}) (bool, error) {
		runs.Add(1)
		_, err := tx.Exec(ctx, `SELECT raise_serialization_failure()`)
		return false, err
	}, nil)
	router, err := replica.New(db.Pool, db.Pool, nil)
	require.NoError(t, err)
	rt, err := framework.NewRuntime(reg, db.Pool, &framework.RuntimeConfig{ReadPool: db.Pool, ReadRouter: router})
	require.NoError(t, err)
	_, err = rt.Query(ctx, framework.Call{Principal: framework.Principal{UserID: "alice", TenantID: "acme"}},
		framework.Command{Type: "replica-test:query:serialization", Payload: json.RawMessage(`{}`)})
	require.Equal(t, framework.CodeConflict, framework.ToError(err).Code, "%v", err)
	require.EqualValues(t, 1, runs.Load(), "run once")
	require.Zero(t, router.Fallbacks(replica.ReasonRecoveryConflict))
}

// TestFallbackCountersStartAtZero: every reason of
// kumiko_replica_fallbacks_total is exported at 0 before the first
// fallback, so that rate() and increase() see that one.
func TestFallbackCountersStartAtZero(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := prometheus.NewRegistry()
	_, err := replica.New(db.Pool, db.Pool, &replica.Config{Metrics: reg})
	require.NoError(t, err)
	fams, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "kumiko_replica_fallbacks_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	require.Equal(t, map[string]float64{replica.ReasonLag: 0, replica.ReasonError: 0, replica.ReasonRecoveryConflict: 0}, got)
}
