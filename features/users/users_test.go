package users_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/users"
	"github.com/kumiko-go/kumiko/framework"
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
