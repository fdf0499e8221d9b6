package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// A rebuild whose temporary consumer an operator disables meanwhile stops
// with 409 rebuild_disabled (no 500), removes what it built and leaves the
// live table alone.
func TestMaintenanceRebuildWhoseConsumerIsDisabled(t *testing.T) {
	t.Parallel()
	b := setupOps(t)
	tok := b.token(t, "admin")
	b.append(t, b.counted, "a", 200)
	b.drain(t, "ops:tally")
	oid := b.int(t, `SELECT 'tally'::regclass::oid::bigint`)
	b.slow.Store(true)

	type answer struct {
		status int
		raw    []byte
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.url+"/api/admin/projections/ops:tally/rebuild",
			strings.NewReader(`{"batchSize": 1}`))
		if err != nil {
			done <- answer{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := b.client.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer res.Body.Close()
		raw, err := io.ReadAll(res.Body)
		done <- answer{status: res.StatusCode, raw: raw, err: err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for b.int(t, `SELECT coalesce(sum(events_processed), 0) FROM event_consumers WHERE name = 'ops:tally#rebuild'`) < 2 {
		require.True(t, time.Now().Before(deadline), "the rebuild does not start")
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, dispatcher.Disable(context.Background(), b.db.Pool, "ops:tally#rebuild", ""))
	var a answer
	select {
	case a = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the rebuild of a disabled consumer never answers")
	}
	require.NoError(t, a.err)
	var e envelope
	require.NoError(t, json.Unmarshal(a.raw, &e), "body: %s", a.raw)
	e.status = a.status
	requireError(t, e, http.StatusConflict, "conflict")
	require.Equal(t, "rebuild_disabled", e.Error.Details["reason"])
	require.Contains(t, e.Error.Message, "ops:tally#rebuild")
	require.Zero(t, b.leftovers(t))
	require.Equal(t, oid, b.int(t, `SELECT 'tally'::regclass::oid::bigint`), "the live table stays")
}
