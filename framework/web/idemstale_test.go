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
	rkey := b.prefix + ":acme:alice:" + key

	first := make(chan response, 1)
	go func() { first <- b.keyed(t, "/api/write", tok, key, body) }()
	require.Eventually(t, func() bool { return b.calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	b.starveRenewals(t, rkey, key)

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

// TestTakeOverDoesNotCommitAfterStaleOwner: owner A claims a key and is
// held before its first statement (it holds no advisory lock); its lease
// runs out. B takes the key over, finds nothing committed (A has not
// written) and is held before its first statement too. A goes on: its
// guard finds no events of a newer owner (B has not written) and it
// commits. When B goes on, within its fresh lease, it must not commit the
// write a second time: it is answered 409 conflict, committed: true.
func TestTakeOverDoesNotCommitAfterStaleOwner(t *testing.T) {
	t.Parallel()
	gateA, gateB := make(chan struct{}), make(chan struct{})
	a := setupIdem(t, idemOptions{gate: gateA, lease: 600 * time.Millisecond})
	// B's server shares A's database and keys, with the default lease: B
	// commits well within it.
	b := setupIdem(t, idemOptions{db: a.db, prefix: a.prefix, gate: gateB})
	var openedA, openedB sync.Once
	openA := func() { openedA.Do(func() { close(gateA) }) }
	openB := func() { openedB.Do(func() { close(gateB) }) }
	t.Cleanup(openA) // before the servers close
	t.Cleanup(openB)
	tok := a.tokenFor(t, "acme", "alice")
	key := "takeover-" + randHex(8)
	body := map[string]any{"type": "idem-test:write:gated", "payload": map[string]any{"note": "once"}}
	rkey := a.prefix + ":acme:alice:" + key

	first := make(chan response, 1)
	go func() { first <- a.keyed(t, "/api/write", tok, key, body) }()
	require.Eventually(t, func() bool { return a.calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	a.starveRenewals(t, rkey, key)

	second := make(chan response, 1)
	go func() { second <- b.keyed(t, "/api/write", tok, key, body) }()
	// B took the key over, found nothing committed, and runs its handler.
	require.Eventually(t, func() bool { return b.calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 0, a.eventsWithKey(t, key))

	openA()
	ra := <-first
	require.Equal(t, http.StatusOK, ra.status, "A's guard finds nothing of B, and A commits: %s", ra.body)
	require.Equal(t, 1, a.eventsWithKey(t, key))

	openB()
	rb := <-second
	env := rb.requireError(t, http.StatusConflict, "conflict")
	require.Equal(t, 1, a.eventsWithKey(t, key), "the owner that took the key over committed the write a second time")
	require.Equal(t, key, env.Error.Details["idempotencyKey"])
	require.Equal(t, true, env.Error.Details["committed"])
	again := b.keyed(t, "/api/write", tok, key, body)
	require.Equal(t, "true", again.header.Get(web.HeaderIdempotentReplayed))
	require.Equal(t, string(rb.body), string(again.body), "B's answer is stored")
}

// starveRenewals makes the renewals of key's running owner fail (as when
// they cannot reach Redis) until it stopped them, past its first renewal
// (lease/3 of the tests' 600 ms lease), so that its lease runs out. rkey is
// the record's Redis key.
func (b *idemBundle) starveRenewals(t *testing.T, rkey, key string) {
	t.Helper()
	rdb := redistest.Shared(t)
	owner := b.recordOwner(t, "acme", "alice", key)
	require.NoError(t, rdb.HSet(t.Context(), rkey, "owner", "someone-else").Err())
	time.Sleep(450 * time.Millisecond) // the renewal finds the other owner and stops
	require.NoError(t, rdb.HSet(t.Context(), rkey, "owner", owner).Err())
}
