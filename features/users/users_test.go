package users_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/users"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// An address differing only in case is the same user: inviting it again is
// 409 conflict and appends nothing, within the tenant; another tenant may
// invite it. The address is kept as it was typed.
func TestInviteIsCaseInsensitivePerTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	users.Register(reg)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	invite := func(tenant, email string) error {
		_, err := rt.Write(ctx, framework.Call{Principal: framework.Principal{UserID: "admin", TenantID: tenant}},
			[]framework.Command{{Type: "users:write:invite", Payload: json.RawMessage(`{"email":"` + email + `"}`)}})
		return err
	}
	require.NoError(t, invite("t1", "Bob@Example.com"))
	err = invite("t1", "bob@example.COM")
	require.Error(t, err)
	require.Equal(t, framework.CodeConflict, framework.ToError(err).Code, "answered as 409 conflict")
	require.NoError(t, invite("t2", "bob@example.com"))

	var events int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'users:event:invited'`).Scan(&events))
	require.Equal(t, 2, events)
	var stored string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT email FROM users WHERE tenant_id = 't1'`).Scan(&stored))
	require.Equal(t, "Bob@Example.com", stored)
}

// nightlyReportSpec runs register on a fresh registry and returns the
// schedule of users:job:nightly-report.
func nightlyReportSpec(t *testing.T, register func(*framework.Registry)) string {
	t.Helper()
	reg := framework.NewRegistry()
	register(reg)
	require.NoError(t, reg.Build())
	for _, j := range jobs.For(reg).Jobs() {
		if j.Name() == "users:job:nightly-report" {
			return j.Spec()
		}
	}
	t.Fatal("users:job:nightly-report is not registered")
	return ""
}

// TestNightlyReportSpecComesFromOptions: the schedule is the options', and
// the feature reads no environment variable (KUMIKO_SAMPLE_CRON and
// KUMIKO_DEV reach it through the config package and its options).
func TestNightlyReportSpecComesFromOptions(t *testing.T) {
	t.Setenv("KUMIKO_SAMPLE_CRON", "@every 2s")
	t.Setenv("KUMIKO_DEV", "1")
	require.Equal(t, "0 2 * * *", nightlyReportSpec(t, func(r *framework.Registry) { users.Register(r) }))
	require.Equal(t, users.DefaultNightlyReportSpec, nightlyReportSpec(t, func(r *framework.Registry) { users.RegisterWith(r, &users.Options{}) }))
	require.Equal(t, "@every 5s", nightlyReportSpec(t, func(r *framework.Registry) {
		users.RegisterWith(r, &users.Options{NightlyReportSpec: "@every 5s"})
	}))
}
