package idempotency

import (
	"testing"

	"github.com/kumiko-go/kumiko/internal/redistest"
	"github.com/stretchr/testify/require"
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
	t.Cleanup(func() { _ = rdb.Del(t.Context(), key).Err() })
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
