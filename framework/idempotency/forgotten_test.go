package idempotency_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// scriptCalls counts the script calls a Redis server ran, from INFO
// commandstats.
func scriptCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	require.NoError(t, err)
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

type begun struct {
	claim *idempotency.Claim
	resp  *idempotency.Response
	err   error
}

// beginWaiting starts Begin of sc in the background and returns once it
// saw the key pending (it polled twice).
func beginWaiting(t *testing.T, s *idempotency.Store, rdb *redis.Client, sc idempotency.Scope) <-chan begun {
	t.Helper()
	calls := scriptCalls(t, rdb)
	out := make(chan begun, 1)
	go func() {
		c, r, err := s.Begin(t.Context(), sc, "fp")
		out <- begun{c, r, err}
	}()
	require.Eventually(t, func() bool { return scriptCalls(t, rdb) >= calls+2 }, 10*time.Second, time.Millisecond)
	return out
}

// A waiter that saw a key pending, and finds it gone (Redis restarted
// empty, or was flushed), restores the owner's claim instead of claiming
// afresh; when that owner is dead, the waiter takes the key over once the
// restored lease ends, as the previous owner's successor: it checks for
// that owner's writes, over the span since its claim.
func TestWaiterRestoresAForgottenClaim(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	lease := 500 * time.Millisecond
	s, _ := newStore(t, rdb, idempotency.Config{Lease: lease, WaitTimeout: 15 * time.Second})
	ctx := t.Context()
	dead, _, err := s.Begin(ctx, scope("forgotten"), "fp")
	require.NoError(t, err)
	claimed := time.Now()
	dead.Abandon() // its process dies; its lease would run out
	waiter := beginWaiting(t, s, rdb, scope("forgotten"))
	require.NoError(t, rdb.FlushAll(ctx).Err())
	got := <-waiter
	require.NoError(t, got.err)
	require.NotNil(t, got.claim)
	require.Equal(t, dead.Owner(), got.claim.PreviousOwner(), "taken over from the owner it saw, not claimed afresh")
	require.GreaterOrEqual(t, got.claim.PreviousSince(), time.Since(claimed)-lease, "the span since the first claim")
	require.NoError(t, got.claim.Finish(ctx, response("once")))
}

// A waiter whose owner released the key (nothing ran) claims it at once:
// a released key is not a forgotten one.
func TestWaiterClaimsAReleasedKeyAtOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	s, _ := newStore(t, rdb, idempotency.Config{WaitTimeout: 5 * time.Second})
	ctx := t.Context()
	first, _, err := s.Begin(ctx, scope("released"), "fp")
	require.NoError(t, err)
	waiter := beginWaiting(t, s, rdb, scope("released"))
	require.NoError(t, first.Release(ctx))
	got := <-waiter
	require.NoError(t, got.err)
	require.NotNil(t, got.claim)
	require.Empty(t, got.claim.PreviousOwner())
	require.NoError(t, got.claim.Finish(ctx, response("ran")))
	// Claimed afresh whatever the fingerprint, as a deleted key was.
	c, _, err := s.Begin(ctx, scope("released-other"), "fp")
	require.NoError(t, err)
	require.NoError(t, c.Release(ctx))
	c, _, err = s.Begin(ctx, scope("released-other"), "another")
	require.NoError(t, err)
	require.NoError(t, c.Release(ctx))
}

// An owner whose record Redis forgot puts it back with its next renewal,
// and stores its response into it: a request with the key meanwhile waits
// for it (or is told the key was used for another request), and a retry
// replays it.
func TestOwnerRestoresAForgottenClaim(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	s, _ := newStore(t, rdb, idempotency.Config{Prefix: "idem", Lease: 300 * time.Millisecond, WaitTimeout: 200 * time.Millisecond})
	ctx := t.Context()
	owner, _, err := s.Begin(ctx, scope("renewed"), "fp")
	require.NoError(t, err)
	require.NoError(t, rdb.FlushAll(ctx).Err())
	// Its next renewal (every lease/3) puts it back.
	require.Eventually(t, func() bool { return rdb.Exists(ctx, "idem:acme:alice:renewed").Val() == 1 }, 5*time.Second, time.Millisecond)
	_, _, err = s.Begin(ctx, scope("renewed"), "fp")
	require.ErrorIs(t, err, idempotency.ErrInProgress)
	_, _, err = s.Begin(ctx, scope("renewed"), "other")
	require.ErrorIs(t, err, idempotency.ErrKeyReused)
	require.NoError(t, owner.Finish(ctx, response("first")))
	_, replay, err := s.Begin(ctx, scope("renewed"), "fp")
	require.NoError(t, err)
	require.Equal(t, "first", string(replay.Body))

	// Forgotten again before the finish: the finish stores it all the same.
	owner, _, err = s.Begin(ctx, scope("finished"), "fp")
	require.NoError(t, err)
	require.NoError(t, rdb.FlushAll(ctx).Err())
	require.NoError(t, owner.Finish(ctx, response("stored")))
	_, replay, err = s.Begin(ctx, scope("finished"), "fp")
	require.NoError(t, err)
	require.Equal(t, "stored", string(replay.Body))
}
