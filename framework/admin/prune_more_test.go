package admin_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// pruneCountJSON is the answer of the handled-claims and dead-letters
// prunes.
type pruneCountJSON struct {
	OlderThanDays int   `json:"olderThanDays"`
	Deleted       int64 `json:"deleted"`
}

// seedOld writes two old and one young HandledOnce claim and dead letter.
func (b *opsBundle) seedOld(t *testing.T) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `
		INSERT INTO handled (tenant_id, key, handled_at) VALUES
		  ('acme', 'old-1', now() - interval '91 days'),
		  ('globex', 'old-2', now() - interval '120 days'),
		  ('acme', 'new', now() - interval '89 days');
		INSERT INTO event_dead_letters (consumer, instance_id, position, event_type, tenant_id, error, created_at) VALUES
		  ('gone:projection', '__shared__', 1, 'ops:event:ping', 'acme', 'boom', now() - interval '40 days'),
		  ('system:consumer:sse-broadcast', 'api-old', 2, 'ops:event:ping', 'globex', 'boom', now() - interval '31 days'),
		  ('ops:pinger', '__shared__', 3, 'ops:event:ping', 'acme', 'boom', now() - interval '29 days')`)
	require.NoError(t, err)
}

// TestMaintenancePruneHandledAndDeadLetters: the admin API offers `kumiko
// jobs prune-handled` and `kumiko consumer prune-dead-letters` like the
// other maintenance verbs: the admin role is required, bad input is a 400
// that deletes nothing, and a prune deletes only the rows older than the
// cutoff, of every tenant, and answers how many.
func TestMaintenancePruneHandledAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	b.seedOld(t)
	const handled, dead = "/api/admin/jobs/handled/prune", "/api/admin/dead-letters/prune"
	count := func(table string) int64 {
		t.Helper()
		return b.int(t, `SELECT count(*) FROM `+table)
	}
	unchanged := func() {
		t.Helper()
		require.EqualValues(t, 3, count("handled"))
		require.EqualValues(t, 3, count("event_dead_letters"))
	}

	user := b.token(t, "user")
	for _, path := range []string{handled, dead} {
		requireError(t, b.do(t, http.MethodPost, path, "", `{"olderThanDays": 1}`), http.StatusUnauthorized, "unauthorized")
		e := b.do(t, http.MethodPost, path, user, `{"olderThanDays": 1}`)
		requireError(t, e, http.StatusForbidden, "access_denied")
		require.Equal(t, "the admin role is required", e.Error.Message)
	}
	unchanged()

	tok := b.token(t, "admin")
	for _, path := range []string{handled, dead} {
		for body, msg := range map[string]string{
			``:                           "olderThanDays is required",
			`{}`:                         "olderThanDays is required",
			`{"olderThanDays": null}`:    "olderThanDays is required",
			`{"olderThanDays": 0}`:       "olderThanDays must be between 1 and 1000000",
			`{"olderThanDays": -5}`:      "olderThanDays must be between 1 and 1000000",
			`{"olderThanDays": 1000001}`: "olderThanDays must be between 1 and 1000000",
		} {
			e := b.do(t, http.MethodPost, path, tok, body)
			requireError(t, e, http.StatusBadRequest, "validation_error")
			require.Equal(t, "validation failed: "+msg, e.Error.Message, "%s %s", path, body)
			require.NotEmpty(t, e.Error.Details["fields"], body)
		}
		for _, body := range []string{`{"olderThanDays": 1, "dryRun": true}`, `{"olderThanDays": "1"}`,
			`[1]`, `{"olderThanDays": 1} {}`, `{"olderThanDays": 1.5}`} {
			e := b.do(t, http.MethodPost, path, tok, body)
			requireError(t, e, http.StatusBadRequest, "bad_request")
			require.NotEmpty(t, e.Error.Message)
		}
	}
	unchanged()

	res := decode[pruneCountJSON](t, b.do(t, http.MethodPost, handled, tok, `{"olderThanDays": 90}`))
	require.Equal(t, pruneCountJSON{OlderThanDays: 90, Deleted: 2}, res)
	require.EqualValues(t, 1, b.int(t, `SELECT count(*) FROM handled WHERE tenant_id = 'acme' AND key = 'new'`))
	require.EqualValues(t, 1, count("handled"))
	require.EqualValues(t, 3, count("event_dead_letters"), "a handled prune leaves the dead letters")

	res = decode[pruneCountJSON](t, b.do(t, http.MethodPost, dead, tok, `{"olderThanDays": 30}`))
	require.Equal(t, pruneCountJSON{OlderThanDays: 30, Deleted: 2}, res)
	require.EqualValues(t, 1, b.int(t, `SELECT count(*) FROM event_dead_letters WHERE consumer = 'ops:pinger'`))
	require.EqualValues(t, 1, count("event_dead_letters"))
	require.EqualValues(t, 1, count("handled"))

	// Again: nothing left to delete.
	res = decode[pruneCountJSON](t, b.do(t, http.MethodPost, handled, tok, `{"olderThanDays": 90}`))
	require.Zero(t, res.Deleted)
	res = decode[pruneCountJSON](t, b.do(t, http.MethodPost, dead, tok, `{"olderThanDays": 30}`))
	require.Zero(t, res.Deleted)
}

// TestMaintenancePruneHoldsForUnregisteredConsumer: a consumer the API
// process's registry declares that has no state row yet (no process of
// this release ran it) holds the prune back from the start of the log, and
// the refusal says so (status unregistered).
func TestMaintenancePruneHoldsForUnregisteredConsumer(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	b.append(t, b.ping, "p", 3)
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE events SET created_at = now() - interval '40 days';
		DELETE FROM event_consumers WHERE name = 'ops:pinger'`)
	require.NoError(t, err)
	tok := b.token(t, "admin")
	e := b.do(t, http.MethodPost, "/api/admin/events/prune", tok, `{"olderThanDays": 30}`)
	requireError(t, e, http.StatusConflict, "conflict")
	require.Contains(t, e.Error.Message, "ops:pinger (not registered yet, starts at the start of the log): 3 unseen")
	require.Equal(t, []any{map[string]any{"name": "ops:pinger", "instance": "__shared__", "status": "unregistered", "cursor": "0-0", "unseen": float64(3)}},
		e.Error.Details["consumers"])
	require.EqualValues(t, 3, b.int(t, `SELECT count(*) FROM events WHERE type = 'ops:event:ping'`))
}
