package admin_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// requireShortEcho asserts that an error answer repeats at most a bounded
// excerpt of a long client-sent value, not the value itself.
func requireShortEcho(t *testing.T, e envelope, long string) {
	t.Helper()
	require.NotNil(t, e.Error, "want an error envelope")
	msg := e.Error.Message
	require.Less(t, len(msg), 1000, "the message repeats the client's value: %.300s", msg)
	require.True(t, strings.Contains(msg, long[:100]), "the message still names the value: %.300s", msg)
	for k, v := range e.Error.Details {
		if s, ok := v.(string); ok {
			require.Less(t, len(s), 300, "details.%s repeats the client's value", k)
		}
	}
}

// TestAdminRepeatsAnExcerptOfALongValue: a consumer name or instance of
// 10 KB is answered with an error that repeats a bounded excerpt of it, as
// the core API does for an unknown type, not the whole value.
func TestAdminRepeatsAnExcerptOfALongValue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	long := strings.Repeat("x", 10<<10)

	e := b.do(t, http.MethodGet, "/api/admin/consumers/"+long, tok, "")
	requireError(t, e, http.StatusNotFound, "not_found")
	requireShortEcho(t, e, long)

	e = b.do(t, http.MethodGet, "/api/admin/consumers/adm:healthy?instance="+long, tok, "")
	requireError(t, e, http.StatusNotFound, "not_found")
	requireShortEcho(t, e, long)

	e = b.do(t, http.MethodPost, "/api/admin/consumers/"+long+"/restart", tok, "")
	requireError(t, e, http.StatusNotFound, "not_found")
	requireShortEcho(t, e, long)

	e = b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/disable", tok, `{"instance": "`+long+`"}`)
	requireError(t, e, http.StatusNotFound, "not_found")
	requireShortEcho(t, e, long)

	e = b.do(t, http.MethodDelete, "/api/admin/instances/"+long, tok, "")
	requireError(t, e, http.StatusNotFound, "not_found")
	requireShortEcho(t, e, long)
}

// TestMaintenanceRepeatsAnExcerptOfALongValue: the same for a prune's
// type and a rebuild's projection name.
func TestMaintenanceRepeatsAnExcerptOfALongValue(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	long := strings.Repeat("x", 10<<10)

	e := b.do(t, http.MethodPost, "/api/admin/events/prune", tok, `{"olderThanDays": 30, "types": ["`+long+`"]}`)
	requireError(t, e, http.StatusBadRequest, "validation_error")
	requireShortEcho(t, e, long)

	e = b.do(t, http.MethodPost, "/api/admin/projections/"+long+"/rebuild", tok, "")
	requireError(t, e, http.StatusNotFound, "not_found")
	requireShortEcho(t, e, long)
}
