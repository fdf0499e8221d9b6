package web_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
)

// scriptCalls counts the script calls a Redis server ran (claims,
// renewals, finishes), from INFO commandstats.
func scriptCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	if err != nil {
		return -1 // restarting
	}
	n := 0
	for line := range strings.SplitSeq(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		_, rest, _ := strings.Cut(line, "calls=")
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.Atoi(calls)
		require.NoError(t, err)
		n += c
	}
	return n
}

// TestDuplicateWaitingWhileRedisForgetsTheKey: owner A claims a key and is
// held inside its handler; a duplicate B waits for A's result. Redis
// forgets the key (flushed, or restarted empty). B must not claim the
// key afresh and run the write a second time while A still runs: A's
// write commits once, and B (like every later retry) gets A's response.
func TestDuplicateWaitingWhileRedisForgetsTheKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, write string
		restart     bool
	}{
		{"flushed, owner before its first statement", "gated", false},
		{"flushed, owner holding the key's lock", "gated-locked", false},
		{"restarted empty, owner before its first statement", "gated", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := jobstest.StartRedis(t)
			rdb := srv.Client(t)
			gate := make(chan struct{})
			b := setupIdem(t, idemOptions{rdb: rdb, gate: gate})
			var opened sync.Once
			open := func() { opened.Do(func() { close(gate) }) }
			t.Cleanup(open) // before the server closes
			tok := b.tokenFor(t, "acme", "alice")
			key := "forgotten-" + randHex(8)
			body := map[string]any{"type": "idem-test:write:" + tc.write, "payload": map[string]any{"note": "once"}}

			first := make(chan response, 1)
			go func() { first <- b.keyed(t, "/api/write", tok, key, body) }()
			require.Eventually(t, func() bool { return b.calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
			claims := scriptCalls(t, rdb)
			second := make(chan response, 1)
			go func() { second <- b.keyed(t, "/api/write", tok, key, body) }()
			// B polled twice: it saw the key pending.
			require.Eventually(t, func() bool { return scriptCalls(t, rdb) >= claims+2 }, 10*time.Second, 5*time.Millisecond)

			if tc.restart {
				srv.Stop()
				srv.Start()
			} else {
				require.NoError(t, rdb.FlushAll(context.Background()).Err())
			}
			// B went on polling the empty Redis (a run of its own would
			// have been the second call of the handler by now, or soon).
			polls := scriptCalls(t, rdb)
			require.Eventually(t, func() bool { return scriptCalls(t, rdb) >= polls+3 }, 10*time.Second, 5*time.Millisecond)
			require.EqualValues(t, 1, b.calls.Load(), "the duplicate ran the write while its first owner still runs")

			open()
			a := <-first
			require.Equal(t, http.StatusOK, a.status, "%s", a.body)
			d := <-second
			require.Equal(t, 1, b.eventsWithKey(t, key), "the write committed twice")
			if tc.restart && d.status == http.StatusServiceUnavailable {
				// B polled while Redis was down: not run, and answered so.
				d.requireError(t, http.StatusServiceUnavailable, "idempotency_unavailable")
			} else {
				requireReplayOf(t, a, d)
			}
			// A stored its response into the Redis that had forgotten its
			// claim: a retry replays it instead of running again.
			requireReplayOf(t, a, b.keyed(t, "/api/write", tok, key, body))
			require.Equal(t, 1, b.eventsWithKey(t, key))
			require.EqualValues(t, 1, b.calls.Load())
			require.Contains(t, b.logs.String(), "its pending claim restored")
		})
	}
}

// TestOwnerFinishingIntoAnEmptyRedis: Redis forgets a pending key (no
// duplicate waiting); the owner's response is stored all the same, so
// that a retry replays it instead of running the write again.
func TestOwnerFinishingIntoAnEmptyRedis(t *testing.T) {
	t.Parallel()
	srv := jobstest.StartRedis(t)
	rdb := srv.Client(t)
	gate := make(chan struct{})
	b := setupIdem(t, idemOptions{rdb: rdb, gate: gate})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open)
	tok := b.tokenFor(t, "acme", "alice")
	key := "finish-empty-" + randHex(8)
	body := map[string]any{"type": "idem-test:write:gated", "payload": map[string]any{"note": "once"}}

	first := make(chan response, 1)
	go func() { first <- b.keyed(t, "/api/write", tok, key, body) }()
	require.Eventually(t, func() bool { return b.calls.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, rdb.FlushAll(context.Background()).Err())
	open()
	a := <-first
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.NoError(t, b.store.Close(t.Context())) // A's response is stored (or failed to be)
	again := b.keyed(t, "/api/write", tok, key, body)
	requireReplayOf(t, a, again)
	require.Equal(t, 1, b.eventsWithKey(t, key))
	b.keyed(t, "/api/write", tok, key, map[string]any{"type": "idem-test:write:gated", "payload": map[string]any{"note": "other"}}).
		requireError(t, http.StatusUnprocessableEntity, "idempotency_key_reused")
}
