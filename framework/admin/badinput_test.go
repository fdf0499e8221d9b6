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

// requireClientWording asserts a bad_request whose message names the
// field by its JSON name and kind, without Go identifiers.
func requireClientWording(t *testing.T, e envelope, want string) {
	t.Helper()
	requireError(t, e, http.StatusBadRequest, "bad_request")
	require.Contains(t, e.Error.Message, want)
	for _, goName := range []string{"Go ", "struct", "Body", "int64", "*", "of type int", "of type bool", "of type string"} {
		require.NotContains(t, e.Error.Message, goName)
	}
}

// TestAdminBodyErrorsUseJSONNames: a body value of the wrong kind is
// answered in the client's terms (olderThanDays must be an integer), as
// the core API answers, not with encoding/json's Go type names.
func TestAdminBodyErrorsUseJSONNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	for body, want := range map[string]string{
		`{"instance": 5}`:     "instance must be a string, got number",
		`{"toPosition": 1.5}`: "toPosition must be an integer, got number 1.5",
		`{"toPosition": "0"}`: "toPosition must be an integer, got string",
		`{"toTime": false}`:   "toTime must be a string, got bool",
		`{"to_position": 0}`:  `unknown field "to_position"`,
	} {
		requireClientWording(t, b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy/rewind", tok, body), want)
	}
}

// TestMaintenanceBodyErrorsUseJSONNames: the same for the maintenance
// routes' bodies.
func TestMaintenanceBodyErrorsUseJSONNames(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	for _, path := range []string{"/api/admin/events/prune", "/api/admin/jobs/handled/prune", "/api/admin/dead-letters/prune"} {
		for body, want := range map[string]string{
			`{"olderThanDays": 1.5}`:  "olderThanDays must be an integer, got number 1.5",
			`{"olderThanDays": "30"}`: "olderThanDays must be an integer, got string",
			`{"olderThanDays": 1e99}`: "olderThanDays must be an integer",
		} {
			requireClientWording(t, b.do(t, http.MethodPost, path, tok, body), want)
		}
	}
	requireClientWording(t, b.do(t, http.MethodPost, "/api/admin/events/prune", tok, `{"olderThanDays": 30, "dryRun": "yes"}`),
		"dryRun must be a boolean, got string")
	requireClientWording(t, b.do(t, http.MethodPost, "/api/admin/events/prune", tok, `{"olderThanDays": 30, "dry_run": true}`),
		`unknown field "dry_run"`)
	requireClientWording(t, b.do(t, http.MethodPost, "/api/admin/projections/ops:tally/rebuild", tok, `{"batchSize": 2.5}`),
		"batchSize must be an integer, got number 2.5")
	requireClientWording(t, b.do(t, http.MethodPost, "/api/admin/projections/ops:tally/rebuild", tok, `{"abandon": 1}`),
		"abandon must be a boolean, got number")
	requireClientWording(t, b.do(t, http.MethodPost, "/api/admin/migrations/up", tok, `{"force": true}`),
		`unknown field "force"`)
}

// TestAdminRefusesARepeatedQueryParameter: ?instance=a&instance=b is 400
// naming the parameter, not read as its first value: the verb acts on
// no row.
func TestAdminRefusesARepeatedQueryParameter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	before := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:local?instance=pod-1", tok, ""))
	for _, q := range []string{"instance=pod-1&instance=pod-2", "instance=pod-1&instance=pod-1", "instance=&instance=pod-1"} {
		e := b.do(t, http.MethodGet, "/api/admin/consumers/adm:local?"+q, tok, "")
		requireError(t, e, http.StatusBadRequest, "bad_request")
		require.Contains(t, e.Error.Message, "instance", q)
		e = b.do(t, http.MethodPost, "/api/admin/consumers/adm:local/disable?"+q, tok, "")
		requireError(t, e, http.StatusBadRequest, "bad_request")
		require.Contains(t, e.Error.Message, "instance", q)
	}
	after := decode[consumerJSON](t, b.do(t, http.MethodGet, "/api/admin/consumers/adm:local?instance=pod-1", tok, ""))
	require.Equal(t, before.Status, after.Status, "the row was not disabled")
}

// TestAdminRefusesABlankInstance: ?instance= or "instance": "" given
// blank, as an unset variable in a script gives it, is refused like the
// CLI's blank --instance, not read as the shared row.
func TestAdminRefusesABlankInstance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tok := b.token(t, "admin")
	for _, c := range []struct{ method, path, body string }{
		{http.MethodGet, "/api/admin/consumers/adm:healthy?instance=", ""},
		{http.MethodGet, "/api/admin/consumers/adm:healthy?instance=%20", ""},
		{http.MethodPost, "/api/admin/consumers/adm:healthy/disable?instance=", ""},
		{http.MethodPost, "/api/admin/consumers/adm:healthy/disable", `{"instance": ""}`},
		{http.MethodPost, "/api/admin/consumers/adm:healthy/disable", `{"instance": " "}`},
	} {
		e := b.do(t, c.method, c.path, tok, c.body)
		requireError(t, e, http.StatusBadRequest, "validation_error")
		require.Contains(t, e.Error.Message, "instance is empty", "%s %s %s", c.method, c.path, c.body)
	}
	// Nothing was disabled.
	e := b.do(t, http.MethodGet, "/api/admin/consumers/adm:healthy", tok, "")
	require.Nil(t, e.Error)
	require.Contains(t, string(e.Data), `"status":"idle"`)
}

// TestAdminRefusesABlankName: a consumer, projection or instance name of
// only white space is refused like an empty one, as the CLI refuses a
// blank NAME, not looked up (a 404) or abandoned as nothing (a 200).
func TestAdminRefusesABlankName(t *testing.T) {
	t.Parallel()
	consumers, ops := setup(t), setupOps(t)
	for _, c := range []struct {
		b                         *bundle
		method, path, body, field string
	}{
		{consumers, http.MethodGet, "/api/admin/consumers/%20", "", "name"},
		{consumers, http.MethodPost, "/api/admin/consumers/%09/disable", "", "name"},
		{consumers, http.MethodDelete, "/api/admin/instances/%20", "", "instance"},
		{ops.bundle, http.MethodPost, "/api/admin/projections/%20/rebuild", "", "name"},
		{ops.bundle, http.MethodPost, "/api/admin/projections/%20/rebuild", `{"abandon": true}`, "name"},
	} {
		e := c.b.do(t, c.method, c.path, c.b.token(t, "admin"), c.body)
		require.Equal(t, http.StatusBadRequest, e.status, "%s %s %s: %+v", c.method, c.path, c.body, e.Error)
		requireError(t, e, http.StatusBadRequest, "validation_error")
		require.Equal(t, "validation failed: "+c.field+" is required", e.Error.Message, "%s %s %s", c.method, c.path, c.body)
	}
}

// TestAdminRefusesVerbsOnARebuildsRow: skip on NAME#rebuild (the name
// escaped, '#' would end the path) is the dispatcher's refusal as 409.
func TestAdminRefusesVerbsOnARebuildsRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	e := b.do(t, http.MethodPost, "/api/admin/consumers/adm:healthy%23rebuild/skip", b.token(t, "admin"), "")
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "kumiko projection rebuild adm:healthy --abandon")
}
