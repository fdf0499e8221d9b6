package admin_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// Abandon removes the leftover of a projection that can no longer be
// rebuilt (here side-effect-only), which would pin retention forever; a
// rebuild of it is still refused.
func TestMaintenanceAbandonOfAProjectionNoLongerRebuildable(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	_, err := b.db.Pool.Exec(context.Background(), `CREATE SCHEMA `+pgx.Identifier{rebuild.ShadowSchema("ops:pinger")}.Sanitize()+`;
		INSERT INTO event_consumers (name, instance_id) VALUES ('ops:pinger#rebuild', '__shared__')`)
	require.NoError(t, err)
	const path = "/api/admin/projections/ops:pinger/rebuild"
	res := decode[rebuildJSON](t, b.do(t, http.MethodPost, path, tok, `{"abandon": true}`))
	require.True(t, *res.Removed)
	require.Zero(t, b.leftovers(t))
	e := b.do(t, http.MethodPost, path, tok, "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "not_rebuildable", e.Error.Details["reason"])
}
