package idempotency

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/internal/redistest"
)

// A claim that runs twice for its owner (go-redis retries a command whose
// answer came too late) is the owner's both times: Begin gets its claim,
// and a claim Begin gave up on is released by releaseLate, instead of the
// key waiting out a lease nobody renews.
func TestClaimRunTwiceByItsOwnerIsClaimed(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, err := New(rdb, &Config{Prefix: "kumiko-test:idem:" + newOwner()[:12]})
	require.NoError(t, err)
	key := s.redisKey(Scope{TenantID: "acme", UserID: "alice", Key: "twice"})
	t.Cleanup(func() { _ = rdb.Del(context.Background(), key).Err() })
	owner := newOwner()
	for range 2 {
		res, err := s.cmd.Run(t.Context(), claimScript, []string{key}, owner, "fp", s.lease.Milliseconds(), s.ttl.Milliseconds()).Slice()
		require.NoError(t, err)
		require.Equal(t, "claimed", res[0])
	}
	res, err := s.cmd.Run(t.Context(), claimScript, []string{key}, newOwner(), "fp", s.lease.Milliseconds(), s.ttl.Milliseconds()).Slice()
	require.NoError(t, err)
	require.Equal(t, "pending", res[0], "another owner still waits")
}

// A reclaim run twice by its new owner (its first answer lost) answers
// reclaimed, with the dead owner and the span, both times: a plain claimed
// would let the caller skip its check for the dead owner's writes.
func TestReclaimRunTwiceByItsOwnerIsReclaimed(t *testing.T) {
	t.Parallel()
	rdb, _, key, claim := scriptKey(t, "reclaim-twice")
	dead, owner := newOwner(), newOwner()
	require.Equal(t, "claimed", claim(dead)[0])
	require.NoError(t, rdb.HSet(t.Context(), key, "lease", 0).Err()) // its lease ran out
	for range 2 {
		res := claim(owner)
		require.Equal(t, "reclaimed", res[0])
		require.Equal(t, dead, res[1])
		require.NotEmpty(t, res[2], "the span since the first claim")
	}
}

// A renewal of an owner that released a reclaimed key, reaching Redis after
// the release, does not take the key back (the record is kept for the
// next reclaim, see releaseScript).
func TestRenewalAfterReleaseOfAReclaimedKey(t *testing.T) {
	t.Parallel()
	rdb, s, key, claim := scriptKey(t, "renew-released")
	dead, owner := newOwner(), newOwner()
	require.Equal(t, "claimed", claim(dead)[0])
	require.NoError(t, rdb.HSet(t.Context(), key, "lease", 0).Err()) // its lease ran out
	require.Equal(t, "reclaimed", claim(owner)[0])
	ok, err := s.cmd.Run(t.Context(), releaseScript, []string{key}, owner, s.pendingTTL().Milliseconds()).Int()
	require.NoError(t, err)
	require.Equal(t, 1, ok)
	ok, err = s.cmd.Run(t.Context(), renewScript, []string{key}, owner, s.lease.Milliseconds(), s.ttl.Milliseconds(), "fp", 0, "").Int()
	require.NoError(t, err)
	require.Zero(t, ok, "the releaser renewed the released key")
	require.Equal(t, "reclaimed", claim(newOwner())[0], "the next request reclaims at once")
}

// scriptKey returns a store on the shared Redis, the record of its key
// name (removed after the test) and a function that runs the claim script
// on it for an owner.
func scriptKey(t *testing.T, name string) (redis.UniversalClient, *Store, string, func(owner string) []any) {
	t.Helper()
	rdb := redistest.Shared(t)
	s, err := New(rdb, &Config{Prefix: "kumiko-test:idem:" + newOwner()[:12]})
	require.NoError(t, err)
	key := s.redisKey(Scope{TenantID: "acme", UserID: "alice", Key: name})
	t.Cleanup(func() { _ = rdb.Del(context.Background(), key).Err() })
	return rdb, s, key, func(owner string) []any {
		res, err := s.cmd.Run(t.Context(), claimScript, []string{key}, owner, "fp", s.lease.Milliseconds(), s.ttl.Milliseconds()).Slice()
		require.NoError(t, err)
		return res
	}
}
