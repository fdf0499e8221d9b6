package entrypoint_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// pendingSet is Kumiko's migrations plus 00099_release_table.sql, which
// creates the table release_log.
func pendingSet(t *testing.T) fstest.MapFS {
	t.Helper()
	set := kumikotest.Migrations(t)
	set["00099_release_table.sql"] = &fstest.MapFile{Data: []byte(`-- +goose Up
CREATE TABLE release_log (tenant_id text NOT NULL, n int NOT NULL);
SELECT kumiko_enable_tenancy('release_log');
-- +goose Down
DROP TABLE release_log;
`)}
	return set
}

// TestMigrationGateTellsAnUncheckableDatabase: while the migrations are
// pending the gate tells to run kumiko migrate; when the database cannot
// be reached, the migrations cannot be checked at all, and telling the
// operator to run kumiko migrate (which would fail the same way) sent them
// looking at the migrations instead of the database.
func TestMigrationGateTellsAnUncheckableDatabase(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	register := func(r *framework.Registry) {
		f := r.Feature("release")
		ev := framework.DefineEvent[struct{}](f, "noted", nil)
		p := framework.MultiStreamProjection(f, "log", nil)
		framework.On(p, ev, func(context.Context, *framework.Tx, framework.Event[struct{}]) error { return nil })
	}
	type line struct {
		Msg   string `json:"msg"`
		Error string `json:"error"`
	}
	logs := &proctest.Buffer{}
	lines := func() []line {
		var out []line
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var l line
			require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
			out = append(out, l)
		}
		return out
	}
	// waitFor returns the gate's first log line with an error containing
	// errPart.
	waitFor := func(errPart string) line {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			for _, l := range lines() {
				if strings.HasPrefix(l.Msg, "consumers and jobs wait") && strings.Contains(l.Error, errPart) {
					return l
				}
			}
			require.True(t, time.Now().Before(deadline), "no log line with %q; logs:\n%s", errPart, logs.String())
			time.Sleep(20 * time.Millisecond)
		}
	}
	cfg := newConfig(t, map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL, "KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "20"})
	serve(t, entrypoint.Options{Config: cfg, Register: register, Migrations: pendingSet(t),
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})

	pending := waitFor("00099_release_table.sql")
	require.Contains(t, pending.Msg, "run kumiko migrate")

	// The database stops taking connections.
	admin, err := pgx.Connect(ctx, kumikotest.AdminURL())
	require.NoError(t, err)
	defer admin.Close(ctx)
	name := pgx.Identifier{db.Name}.Sanitize()
	_, err = admin.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s ALLOW_CONNECTIONS false`, name))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db.Name)
	require.NoError(t, err)

	down := waitFor("not currently accepting connections")
	require.NotContains(t, down.Msg, "kumiko migrate", "the database is unreachable, not behind its migrations")
	require.Contains(t, down.Msg, "could not be checked")
}

// TestConsumersWaitForPendingMigrations: a release whose projection writes
// a table that its own migration creates, started before that migration ran
// (`kumiko migrate` not run yet, or still running), must not run the
// projection against the old schema: every pass would fail on the missing
// table, and after MaxAttempts (about 80 s with the defaults) the
// projection would be dead, staying dead after the migration until an
// operator restarts it. The process's consumers wait until the migrations
// are applied, then deliver.
func TestConsumersWaitForPendingMigrations(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ctx := context.Background()
	set := pendingSet(t)

	type noted struct {
		N int `json:"n"`
	}
	register := func(r *framework.Registry) {
		f := r.Feature("release")
		ev := framework.DefineEvent[noted](f, "noted", nil)
		p := framework.MultiStreamProjection(f, "log", &framework.ProjectionOptions{Table: "release_log"})
		framework.On(p, ev, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			_, err := tx.Exec(ctx, `INSERT INTO release_log (tenant_id, n) VALUES ($1, $2)`, e.TenantID, e.Payload.N)
			return err
		})
	}
	_, err := eventstore.Append(ctx, db.Pool, eventstore.StreamRef{TenantID: "acme", Type: "s", ID: "1"}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: "release:event:noted", TypeVersion: 1, Payload: []byte(`{"n":7}`)}})
	require.NoError(t, err)

	logs := &proctest.Buffer{}
	cfg := newConfig(t, map[string]string{"APP_MODE": "worker", "DATABASE_URL": db.URL, "KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "20"})
	serve(t, entrypoint.Options{Config: cfg, Register: register, Migrations: set,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})

	time.Sleep(2 * time.Second) // passes would have failed by now
	var failures int
	require.NoError(t, db.Pool.QueryRow(ctx,
		`SELECT count(*) FROM event_consumers WHERE name = 'release:log' AND (attempts > 0 OR last_error IS NOT NULL)`).Scan(&failures))
	require.Zero(t, failures, "the projection ran against the unmigrated schema; logs:\n%s", logs.String())
	require.Contains(t, logs.String(), "00099_release_table.sql", "a warning names the pending migration")

	deadline := time.Now().Add(wait)
	_, err = migrate.Up(ctx, db.Pool, set, nil)
	require.NoError(t, err)
	for {
		var n int
		err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM release_log WHERE n = 7`).Scan(&n)
		require.NoError(t, err)
		if n == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the projection did not deliver after the migration; logs:\n%s", logs.String())
		time.Sleep(20 * time.Millisecond)
	}
}
