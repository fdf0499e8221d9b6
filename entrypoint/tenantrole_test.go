package entrypoint_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/migrate"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// roleDB creates a LOGIN role without any privilege (no superuser, no
// member of kumiko_tenant) and an empty database it owns, as a hosting
// provider hands them out; both are dropped when the test ends. It returns
// the role's name, a URL connecting as it, and an admin connection.
func roleDB(t *testing.T) (role, dbURL string, admin *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, kumikotest.AdminURL())
	require.NoError(t, err)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	role, name := "kumiko_r_"+suffix, "kumiko_t_"+suffix
	// kumiko_tenant exists in the cluster already (created by another
	// owner), which is the case the role cannot grant itself.
	_, err = admin.Exec(ctx, `DO $$ BEGIN CREATE ROLE kumiko_tenant NOLOGIN;
		EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN`, role))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, name))
		_, err := admin.Exec(ctx, fmt.Sprintf(`DROP ROLE IF EXISTS %s`, role))
		_ = admin.Close(ctx)
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	_, err = admin.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s OWNER %s`, name, role))
	require.NoError(t, err)
	u, err := url.Parse(kumikotest.WithDatabase(kumikotest.AdminURL(), name))
	require.NoError(t, err)
	u.User = url.User(role)
	return role, u.String(), admin
}

// isMember reports whether role may SET ROLE kumiko_tenant.
func isMember(t *testing.T, admin *pgx.Conn, role string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, admin.QueryRow(context.Background(), `SELECT pg_has_role($1, 'kumiko_tenant', 'MEMBER')`, role).Scan(&ok))
	return ok
}

// rolePool is a pool connecting as the role of dbURL, closed when the test
// ends.
func rolePool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestMigrateRefusesWithoutTenantRole: a non-superuser that cannot grant
// itself the existing kumiko_tenant role gets a migration error that says
// what to run, instead of a "successful" migration after which every write
// fails; once granted, the migration runs.
func TestMigrateRefusesWithoutTenantRole(t *testing.T) {
	t.Parallel()
	role, dbURL, admin := roleDB(t)
	pool := rolePool(t, dbURL)
	_, err := migrate.Up(context.Background(), pool, nil, nil)
	require.Error(t, err)
	require.Contains(t, err.Error(), "GRANT kumiko_tenant TO "+role)
	require.False(t, isMember(t, admin, role))

	_, err = admin.Exec(context.Background(), fmt.Sprintf(`GRANT kumiko_tenant TO %s`, role))
	require.NoError(t, err)
	_, err = migrate.Up(context.Background(), pool, nil, nil)
	require.NoError(t, err)
}

// ungranted serves an api App on a database migrated while its user was
// a member of kumiko_tenant (as an older migration left it when it
// swallowed the failed grant) whose user is not a member now. It returns
// the role and the App's log.
func ungranted(t *testing.T) (role string, s *served, logs *proctest.Buffer) {
	t.Helper()
	role, dbURL, admin := roleDB(t)
	ctx := context.Background()
	_, err := admin.Exec(ctx, fmt.Sprintf(`GRANT kumiko_tenant TO %s`, role))
	require.NoError(t, err)
	_, err = migrate.Up(ctx, rolePool(t, dbURL), nil, nil)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, fmt.Sprintf(`REVOKE kumiko_tenant FROM %s`, role))
	require.NoError(t, err)
	require.False(t, isMember(t, admin, role))

	rds := jobstest.StartRedis(t)
	logs = &proctest.Buffer{}
	cfg := newConfig(t, map[string]string{"APP_MODE": "api", "DATABASE_URL": dbURL, "REDIS_URL": rds.URL})
	s = serve(t, entrypoint.Options{Config: cfg, Register: features.Register,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	return role, s, logs
}

// TestTenantRoleMissingIsReported: when the database user is not a member
// of kumiko_tenant, boot logs an ERROR and readiness fails, both naming
// the GRANT to run.
func TestTenantRoleMissingIsReported(t *testing.T) {
	t.Parallel()
	role, s, logs := ungranted(t)
	deadline := time.Now().Add(wait)
	for !strings.Contains(logs.String(), `"level":"ERROR","msg":"database misconfigured`) {
		require.True(t, time.Now().Before(deadline), "no boot ERROR; logs:\n%s", logs.String())
		time.Sleep(20 * time.Millisecond)
	}
	require.Contains(t, logs.String(), "GRANT kumiko_tenant TO "+role)

	r := s.app.Ready(context.Background())
	require.Equal(t, "unavailable", r.Status)
	var check *entrypoint.Check
	for i := range r.Checks {
		if r.Checks[i].Name == "tenant_role" {
			check = &r.Checks[i]
		}
	}
	require.NotNil(t, check, "%+v", r.Checks)
	require.False(t, check.OK)
	require.Contains(t, check.Error, "GRANT kumiko_tenant TO "+role)
}

// TestTenantRoleMissingWriteIsInternal: when the database user is not a
// member of kumiko_tenant, a write answers 500 internal (a server
// misconfiguration, logged with its cause), not 403 access_denied.
func TestTenantRoleMissingWriteIsInternal(t *testing.T) {
	t.Parallel()
	_, s, logs := ungranted(t)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	code, body, err := post(ctx, t, s.url+"/api/write", "acme",
		map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "c", "amountCents": 100}})
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, code, string(body))
	var res struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(body, &res))
	require.Equal(t, "internal", res.Error.Code)
	require.Contains(t, logs.String(), "permission denied to set role")
	require.Contains(t, logs.String(), "GRANT kumiko_tenant TO")
}
