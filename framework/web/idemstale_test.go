package web_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/web"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// TestStaleOwnerDoesNotCommitAfterTakeOver: owner A claims a key and is
// held before its first statement; its lease runs out (its renewals do not
// extend it: here the record names another owner for a moment). B takes
// the key over, finds nothing committed, runs and stores its result. When
// A goes on, it must not commit the write a second time.
func TestStaleOwnerDoesNotCommitAfterTakeOver(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	b := setupIdem(t, idemOptions{gate: gate, lease: 600 * time.Millisecond})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the server closes
	tok := b.tokenFor(t, "acme", "alice")
	key := "stale-" + randHex(8)
	body := map[string]any{"type": "idem-test:write:gated", "payload": map[string]any{"note": "once"}}
	rdb := redistest.Shared(t)
	rkey := b.prefix + ":acme:alice:" + key

	first := make(chan response, 1)
	go func() { first <- b.keyed(t, "/api/write", tok, key, body) }()
	require.Eventually(t, func() bool { return b.calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	// A's renewals fail (as when they cannot reach Redis), and its lease
	// runs out.
	owner := b.recordOwner(t, "acme", "alice", key)
	require.NoError(t, rdb.HSet(t.Context(), rkey, "owner", "someone-else").Err())
	time.Sleep(450 * time.Millisecond) // past A's first renewal (lease/3), which finds the other owner and stops
	require.NoError(t, rdb.HSet(t.Context(), rkey, "owner", owner).Err())

	second := b.keyed(t, "/api/write", tok, key, body)
	require.Equal(t, http.StatusOK, second.status, "%s", second.body)
	require.Equal(t, 1, b.eventsWithKey(t, key))

	open()
	a := <-first
	a.requireError(t, http.StatusConflict, "conflict")
	require.Equal(t, 1, b.eventsWithKey(t, key), "the stale owner committed the write a second time")
	again := b.keyed(t, "/api/write", tok, key, body)
	require.Equal(t, "true", again.header.Get(web.HeaderIdempotentReplayed))
	require.Equal(t, string(second.body), string(again.body), "B's result stays stored")
}
