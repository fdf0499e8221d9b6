package web_test

import (
	"context"
	"encoding/binary"
	"math/bits"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// A client chooses its idempotency key, and a keyed write holds an advisory
// lock on it for its whole transaction. Postgres' hashtextextended is no
// cryptographic hash: a tenant can compute, offline, a key whose lock is
// the very lock a shared consumer's passes take (or a rebuild's, a prune's,
// goose's), and a stream of keyed writes with such keys pauses that
// consumer for every tenant. A keyed write's lock must never be one of the
// framework's own.
func TestIdempotencyKeyCannotTakeAConsumersLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	gate := make(chan struct{})
	b := setupIdem(t, idemOptions{gate: gate})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the server closes

	reg := framework.NewRegistry()
	orders.Register(reg)
	d, err := dispatcher.New(b.db.Pool, reg, dispatcher.ProjectionConsumers(reg, nil), &dispatcher.Config{InstanceID: "idem-lock", PollOnly: true})
	require.NoError(t, err)
	require.NoError(t, d.Register(ctx))

	// Another tenant's order, for the shared projection orders:order-totals.
	res := b.post(t, "/api/write", b.token(t, "victim"), map[string]any{"type": "orders:write:place",
		"payload": map[string]any{"customer": "Ada", "amountCents": 100}})
	require.Equal(t, http.StatusOK, res.status, string(res.body))
	b.db.WaitVisible(t)

	// The attacker's key: its lock string hashes to the consumer's lock.
	var target int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT hashtextextended($1, 0)`,
		dispatcher.LockKey("orders:order-totals", dispatcher.SharedInstance)).Scan(&target))
	prefix := "kumiko-idempotency\x1facme\x1fmallory\x1f"
	key := collidingKey(prefix, target)
	var got int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT hashtextextended($1, 0)`, prefix+key).Scan(&got))
	require.Equal(t, target, got, "the crafted key %q collides in Postgres", key)

	first := make(chan response, 1)
	go func() {
		first <- b.keyed(t, "/api/write", b.tokenFor(t, "acme", "mallory"), key,
			map[string]any{"type": "idem-test:write:gated-locked", "payload": map[string]any{"note": "hold"}})
	}()
	// The write holds its key's lock (taken with its first statement) and
	// waits at the gate.
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n))
		return b.calls.Load() == 1 && n > 0
	}, 10*time.Second, 5*time.Millisecond)

	// The other tenant's event is delivered meanwhile.
	var delivered int
	require.Eventually(t, func() bool {
		n, err := d.RunOnce(ctx, "orders:order-totals")
		require.NoError(t, err)
		delivered += n
		return delivered == 1
	}, 3*time.Second, 50*time.Millisecond, "a tenant's idempotency key paused a shared consumer for every tenant")

	open()
	r := <-first
	require.Equal(t, http.StatusOK, r.status, string(r.body))
}

// collidingKey returns an idempotency key (printable ASCII, no spaces) k
// such that hashtextextended(prefix || k, 0) is target: Postgres' hash
// (Bob Jenkins' lookup3) is invertible, so the last 12 bytes are solved
// for, whatever came before them.
func collidingKey(prefix string, target int64) string {
	pad := (12 - len(prefix)%12) % 12
	head := []byte(prefix)
	for range pad {
		head = append(head, 'x')
	}
	// The state after the full blocks before the solved one.
	sa := 0x9e3779b9 + uint32(len(head)+12) + 3923095
	sb, sc := sa, sa
	for s := head; len(s) >= 12; s = s[12:] {
		sa += binary.LittleEndian.Uint32(s)
		sb += binary.LittleEndian.Uint32(s[4:])
		sc += binary.LittleEndian.Uint32(s[8:])
		sa, sb, sc = lookup3Mix(sa, sb, sc)
	}
	// The final block leaves no tail: the hash is final(mix(state +
	// block)), and its (b, c) is the target; a is free.
	tb, tc := uint32(uint64(target)>>32), uint32(uint64(target))
	var blk [12]byte
	for free := uint32(0); ; free++ {
		a, b, c := lookup3UnFinal(free, tb, tc)
		a, b, c = lookup3UnMix(a, b, c)
		binary.LittleEndian.PutUint32(blk[:], a-sa)
		binary.LittleEndian.PutUint32(blk[4:], b-sb)
		binary.LittleEndian.PutUint32(blk[8:], c-sc)
		printable := true
		for _, x := range blk {
			printable = printable && x > ' ' && x < 0x7f
		}
		if printable {
			return string(head[len(prefix):]) + string(blk[:])
		}
	}
}

func rot(x uint32, k int) uint32 { return bits.RotateLeft32(x, k) }

func lookup3Mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= rot(c, 4)
	c += b
	b -= a
	b ^= rot(a, 6)
	a += c
	c -= b
	c ^= rot(b, 8)
	b += a
	a -= c
	a ^= rot(c, 16)
	c += b
	b -= a
	b ^= rot(a, 19)
	a += c
	c -= b
	c ^= rot(b, 4)
	b += a
	return a, b, c
}

func lookup3UnMix(a, b, c uint32) (uint32, uint32, uint32) {
	b -= a
	c ^= rot(b, 4)
	c += b
	a -= c
	b ^= rot(a, 19)
	b += a
	c -= b
	a ^= rot(c, 16)
	a += c
	b -= a
	c ^= rot(b, 8)
	c += b
	a -= c
	b ^= rot(a, 6)
	b += a
	c -= b
	a ^= rot(c, 4)
	a += c
	return a, b, c
}

func lookup3UnFinal(a, b, c uint32) (uint32, uint32, uint32) {
	c += rot(b, 24)
	c ^= b
	b += rot(a, 14)
	b ^= a
	a += rot(c, 4)
	a ^= c
	c += rot(b, 16)
	c ^= b
	b += rot(a, 25)
	b ^= a
	a += rot(c, 11)
	a ^= c
	c += rot(b, 14)
	c ^= b
	return a, b, c
}
