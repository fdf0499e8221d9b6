package idempotency_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newStore returns a store under a prefix of its own, with its metrics.
func newStore(t *testing.T, rdb redis.UniversalClient, cfg idempotency.Config) (*idempotency.Store, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	if cfg.Prefix == "" {
		cfg.Prefix = "kumiko-test:idem:" + randomHex(6)
	}
	if cfg.TTL == 0 {
		cfg.TTL = time.Minute
	}
	cfg.Metrics = reg
	s, err := idempotency.New(rdb, &cfg)
	require.NoError(t, err)
	return s, reg
}

func scope(key string) idempotency.Scope {
	return idempotency.Scope{TenantID: "acme", UserID: "alice", Key: key}
}

func response(body string) idempotency.Response {
	return idempotency.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func TestSequentialReplay(t *testing.T) {
	t.Parallel()
	s, reg := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()

	claim, replay, err := s.Begin(ctx, scope("k1"), "fp")
	require.NoError(t, err)
	require.Nil(t, replay)
	require.NotNil(t, claim)
	require.Empty(t, claim.PreviousOwner())
	body := "{\"data\":{\"id\":\"x\"}}\n\x00\xff binary tail"
	stored := idempotency.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Kumiko-Consistency-Token": {"0/16B3748"}}, Body: []byte(body)}
	require.NoError(t, claim.Finish(ctx, stored))

	for range 3 {
		claim, replay, err = s.Begin(ctx, scope("k1"), "fp")
		require.NoError(t, err)
		require.Nil(t, claim)
		require.Equal(t, stored.Status, replay.Status)
		require.Equal(t, stored.Header, replay.Header)
		require.Equal(t, []byte(body), replay.Body, "replayed byte for byte")
	}
	require.InDelta(t, 3, counter(t, reg, "kumiko_idempotency_replays_total"), 0)

	// A failure is stored and replayed like a success.
	claim, _, err = s.Begin(ctx, scope("k2"), "fp")
	require.NoError(t, err)
	failure := idempotency.Response{Status: 409, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"error":{"code":"conflict"}}`)}
	require.NoError(t, claim.Finish(ctx, failure))
	_, replay, err = s.Begin(ctx, scope("k2"), "fp")
	require.NoError(t, err)
	require.Equal(t, failure.Status, replay.Status)
	require.Equal(t, failure.Body, replay.Body)
}

func TestFingerprintMismatch(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("k"), "fp-1")
	require.NoError(t, err)
	// While pending.
	_, _, err = s.Begin(ctx, scope("k"), "fp-2")
	require.ErrorIs(t, err, idempotency.ErrKeyReused)
	require.NoError(t, claim.Finish(ctx, response(`{}`)))
	// When done.
	_, _, err = s.Begin(ctx, scope("k"), "fp-2")
	require.ErrorIs(t, err, idempotency.ErrKeyReused)
	// The original still replays.
	_, replay, err := s.Begin(ctx, scope("k"), "fp-1")
	require.NoError(t, err)
	require.Equal(t, []byte(`{}`), replay.Body)
}

func TestScopeIsolation(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	scopes := []idempotency.Scope{
		{TenantID: "acme", UserID: "alice", Key: "same"},
		{TenantID: "acme", UserID: "bob", Key: "same"},
		{TenantID: "globex", UserID: "alice", Key: "same"},
		// Separators inside ids must not make two scopes meet.
		{TenantID: "acme:alice", UserID: "x", Key: "same"},
		{TenantID: "acme", UserID: "alice:x", Key: "same"},
	}
	for i, sc := range scopes {
		claim, replay, err := s.Begin(ctx, sc, "fp-"+sc.TenantID+sc.UserID)
		require.NoError(t, err, "scope %d", i)
		require.Nil(t, replay, "scope %d must not see another scope's result", i)
		require.NoError(t, claim.Finish(ctx, response(sc.TenantID+"/"+sc.UserID)))
	}
	for _, sc := range scopes {
		_, replay, err := s.Begin(ctx, sc, "fp-"+sc.TenantID+sc.UserID)
		require.NoError(t, err)
		require.Equal(t, sc.TenantID+"/"+sc.UserID, string(replay.Body))
	}
}

func TestConcurrentDuplicatesWaitForTheOwner(t *testing.T) {
	t.Parallel()
	s, reg := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	const n = 16
	var claims atomic.Int32
	bodies := make([][]byte, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			claim, replay, err := s.Begin(ctx, scope("dup"), "fp")
			if err != nil {
				t.Errorf("begin %d: %v", i, err)
				return
			}
			if claim != nil {
				claims.Add(1)
				time.Sleep(200 * time.Millisecond) // the work
				if err := claim.Finish(ctx, response("the one result")); err != nil {
					t.Errorf("finish: %v", err)
				}
				bodies[i] = []byte("the one result")
				return
			}
			bodies[i] = replay.Body
		})
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, 1, claims.Load(), "exactly one request runs")
	for i := range n {
		require.Equal(t, "the one result", string(bodies[i]), "request %d", i)
	}
	require.InDelta(t, n-1, counter(t, reg, "kumiko_idempotency_replays_total"), 0)
}

func TestWaitTimeoutIsInProgress(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{WaitTimeout: 150 * time.Millisecond})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("slow"), "fp")
	require.NoError(t, err)
	defer claim.Abandon()
	start := time.Now()
	_, _, err = s.Begin(ctx, scope("slow"), "fp")
	require.ErrorIs(t, err, idempotency.ErrInProgress)
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestCrashedOwnerIsReclaimed(t *testing.T) {
	t.Parallel()
	s, reg := newStore(t, redistest.Shared(t), idempotency.Config{Lease: 300 * time.Millisecond})
	ctx := t.Context()
	claimed := time.Now()
	crashed, _, err := s.Begin(ctx, scope("crash"), "fp")
	require.NoError(t, err)
	crashed.Abandon() // the process died: no renewal, no finish
	require.Zero(t, crashed.PreviousSince())

	start := time.Now()
	claim, replay, err := s.Begin(ctx, scope("crash"), "fp")
	require.NoError(t, err)
	require.Nil(t, replay)
	require.NotNil(t, claim, "the duplicate takes the key over once the lease ran out")
	require.Equal(t, crashed.Owner(), claim.PreviousOwner())
	// What the crashed owner did happened since its claim: the span a
	// search for its effects must cover, and no more.
	require.GreaterOrEqual(t, claim.PreviousSince(), 250*time.Millisecond)
	require.LessOrEqual(t, claim.PreviousSince(), time.Since(claimed)+50*time.Millisecond)
	require.NotEqual(t, crashed.Owner(), claim.Owner())
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "not before the lease ran out")
	require.NoError(t, claim.Finish(ctx, response("second")))
	require.InDelta(t, 1, counter(t, reg, "kumiko_idempotency_reclaims_total"), 0)

	// The crashed owner comes back: it can neither finish nor release.
	require.ErrorIs(t, crashed.Finish(ctx, response("first")), idempotency.ErrNotOwner)
	_, replay, err = s.Begin(ctx, scope("crash"), "fp")
	require.NoError(t, err)
	require.Equal(t, "second", string(replay.Body))
}

func TestStaleOwnerCannotOverwrite(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{Lease: 200 * time.Millisecond})
	ctx := t.Context()
	stale, _, err := s.Begin(ctx, scope("stale"), "fp")
	require.NoError(t, err)
	stale.Abandon() // paused past its lease (a long GC pause, a partition)
	newer, _, err := s.Begin(ctx, scope("stale"), "fp")
	require.NoError(t, err)
	require.NotNil(t, newer)

	// While the newer owner runs, the stale one wakes up and tries to
	// store or release: both refused.
	require.ErrorIs(t, stale.Finish(ctx, response("stale")), idempotency.ErrNotOwner)
	require.ErrorIs(t, stale.Release(ctx), idempotency.ErrNotOwner)
	require.NoError(t, newer.Finish(ctx, response("newer")))
	_, replay, err := s.Begin(ctx, scope("stale"), "fp")
	require.NoError(t, err)
	require.Equal(t, "newer", string(replay.Body))
}

func TestLeaseIsRenewedWhileTheOwnerRuns(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{Lease: 150 * time.Millisecond})
	ctx := t.Context()
	owner, _, err := s.Begin(ctx, scope("long"), "fp")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(700 * time.Millisecond) // several leases long
		if err := owner.Finish(ctx, response("long work")); err != nil {
			t.Errorf("finish: %v", err)
		}
	}()
	claim, replay, err := s.Begin(ctx, scope("long"), "fp")
	<-done
	require.NoError(t, err)
	require.Nil(t, claim, "a running owner keeps its key")
	require.Equal(t, "long work", string(replay.Body))
}

// A claim whose owner runs longer than the TTL keeps its key: the
// renewals keep the record alive with the lease, so a duplicate waits for
// the owner instead of claiming the key afresh and running again, and the
// owner's result is stored.
func TestRenewalOutlivesTheTTL(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{TTL: 300 * time.Millisecond, Lease: 150 * time.Millisecond,
		WaitTimeout: 100 * time.Millisecond})
	ctx := t.Context()
	owner, _, err := s.Begin(ctx, scope("longer-than-ttl"), "fp")
	require.NoError(t, err)
	time.Sleep(700 * time.Millisecond) // more than twice the TTL, renewed all along
	claim, _, err := s.Begin(ctx, scope("longer-than-ttl"), "fp")
	require.ErrorIs(t, err, idempotency.ErrInProgress, "a running owner keeps its key")
	require.Nil(t, claim)
	require.NoError(t, owner.Finish(ctx, response("long work")))
	_, replay, err := s.Begin(ctx, scope("longer-than-ttl"), "fp")
	require.NoError(t, err)
	require.Equal(t, "long work", string(replay.Body))
}

func TestReleaseLetsTheNextRequestRun(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("rel"), "fp")
	require.NoError(t, err)
	require.NoError(t, claim.Release(ctx))
	claim, replay, err := s.Begin(ctx, scope("rel"), "fp")
	require.NoError(t, err)
	require.Nil(t, replay)
	require.NotNil(t, claim)
	require.NoError(t, claim.Finish(ctx, response("ok")))
}

func TestTTL(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	prefix := "kumiko-test:idem:" + randomHex(6)
	s, _ := newStore(t, rdb, idempotency.Config{Prefix: prefix, TTL: 2 * time.Hour})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("ttl"), "fp")
	require.NoError(t, err)
	require.NoError(t, claim.Finish(ctx, response("ok")))
	keys, err := rdb.Keys(ctx, prefix+":*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	ttl, err := rdb.PTTL(ctx, keys[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 119*time.Minute)
	require.LessOrEqual(t, ttl, 2*time.Hour)
}

func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, _ := newStore(t, srv.Client(), idempotency.Config{})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("before"), "fp")
	require.NoError(t, err)
	require.NoError(t, claim.Finish(ctx, response("ok")))

	srv.Stop()
	_, _, err = s.Begin(ctx, scope("down"), "fp")
	require.ErrorIs(t, err, idempotency.ErrUnavailable)

	srv.Start() // empty again: no persistence
	claim, replay, err := s.Begin(ctx, scope("down"), "fp")
	require.NoError(t, err)
	require.Nil(t, replay)
	require.NoError(t, claim.Finish(ctx, response("ok")))
}

func TestFinishWhileRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, _ := newStore(t, srv.Client(), idempotency.Config{})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("k"), "fp")
	require.NoError(t, err)
	srv.Stop()
	require.ErrorIs(t, claim.Finish(ctx, response("ok")), idempotency.ErrUnavailable)
}

func TestBeginHonoursContext(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	held, _, err := s.Begin(t.Context(), scope("ctx"), "fp")
	require.NoError(t, err)
	defer held.Abandon()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, _, err = s.Begin(ctx, scope("ctx"), "fp")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestMetricsRegisterTwice(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	rdb := redistest.Shared(t)
	_, err := idempotency.New(rdb, &idempotency.Config{Metrics: reg})
	require.NoError(t, err)
	_, err = idempotency.New(rdb, &idempotency.Config{Metrics: reg})
	require.NoError(t, err, "a second store on the same registry shares the collectors")
	require.Equal(t, 2, testutil.CollectAndCount(reg))
}

func TestValidKey(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"a", "0f3b-uuid-like", "x:y/z", string(make([]byte, 0)) + "~"} {
		require.True(t, idempotency.ValidKey(k), k)
	}
	long := make([]byte, idempotency.MaxKeyLength+1)
	for i := range long {
		long[i] = 'a'
	}
	for _, k := range []string{"", "has space", "tab\t", "ünïcode", string(long), "nul\x00"} {
		require.False(t, idempotency.ValidKey(k), k)
	}
	require.True(t, idempotency.ValidKey(string(long[:idempotency.MaxKeyLength])))
}

func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"", "a", "a b", "ü", "x\x7f", "~!"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		ok := idempotency.ValidKey(k)
		if ok != (len(k) >= 1 && len(k) <= idempotency.MaxKeyLength && printable(k)) {
			t.Fatalf("ValidKey(%q) = %v", k, ok)
		}
	})
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '!' || s[i] > '~' {
			return false
		}
	}
	return true
}

func FuzzFingerprint(f *testing.F) {
	f.Add([]byte("ab"), []byte("c"), []byte("a"), []byte("bc"))
	f.Fuzz(func(t *testing.T, a1, a2, b1, b2 []byte) {
		same := string(a1) == string(b1) && string(a2) == string(b2)
		if (idempotency.Fingerprint(a1, a2) == idempotency.Fingerprint(b1, b2)) != same {
			t.Fatalf("fingerprints of (%q,%q) and (%q,%q): equal=%v, parts equal=%v", a1, a2, b1, b2, !same, same)
		}
	})
}

func TestFinishAsyncAndClose(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	const n = 20
	errs := make(chan error, n+1)
	for i := range n {
		claim, _, err := s.Begin(ctx, scope("async-"+strconv.Itoa(i)), "fp")
		require.NoError(t, err)
		claim.FinishAsync(response("r"+strconv.Itoa(i)), func(err error) { errs <- err })
	}
	require.NoError(t, s.Close(ctx), "Close waits for the responses being stored")
	require.Len(t, errs, n, "every background finish ran before Close returned")
	for i := range n {
		require.NoError(t, <-errs)
		_, replay, err := s.Begin(ctx, scope("async-"+strconv.Itoa(i)), "fp")
		require.NoError(t, err)
		require.Equal(t, "r"+strconv.Itoa(i), string(replay.Body))
	}
	// After Close a finish runs in the caller.
	claim, _, err := s.Begin(ctx, scope("after-close"), "fp")
	require.NoError(t, err)
	claim.FinishAsync(response("sync"), func(err error) { errs <- err })
	require.Len(t, errs, 1)
	require.NoError(t, <-errs)
}

// TestBatchedFinishes: responses queued together are stored by one script
// call, each under its own key, and a stale owner among them is refused
// without harming the others.
func TestBatchedFinishes(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{Lease: 200 * time.Millisecond})
	ctx := t.Context()
	release := idempotency.HoldFinishes(s)

	stale, _, err := s.Begin(ctx, scope("batch-stale"), "fp")
	require.NoError(t, err)
	stale.Abandon()
	newer, _, err := s.Begin(ctx, scope("batch-stale"), "fp") // waits out the lease, then takes over
	require.NoError(t, err)

	const n = 70 // more than one batch
	errs := make([]chan error, n)
	for i := range n {
		claim, _, err := s.Begin(ctx, scope("batch-"+strconv.Itoa(i)), "fp")
		require.NoError(t, err)
		errs[i] = make(chan error, 1)
		claim.FinishAsync(response("r"+strconv.Itoa(i)), func(err error) { errs[i] <- err })
	}
	staleErr := make(chan error, 1)
	stale.FinishAsync(response("stale"), func(err error) { staleErr <- err })
	release()
	require.NoError(t, s.Close(ctx))

	require.ErrorIs(t, <-staleErr, idempotency.ErrNotOwner)
	for i := range n {
		require.NoError(t, <-errs[i], "finish %d", i)
		_, replay, err := s.Begin(ctx, scope("batch-"+strconv.Itoa(i)), "fp")
		require.NoError(t, err)
		require.Equal(t, "r"+strconv.Itoa(i), string(replay.Body))
		require.Equal(t, "application/json", replay.Header.Get("Content-Type"))
	}
	require.NoError(t, newer.Finish(ctx, response("newer")))
	_, replay, err := s.Begin(ctx, scope("batch-stale"), "fp")
	require.NoError(t, err)
	require.Equal(t, "newer", string(replay.Body), "the stale owner's queued response did not land")
}

// hangingRedis returns a private Redis with the client settings of
// `kumiko serve` (10 s read timeout, 3 retries), a store on it with a short
// CallTimeout, and the server, warmed up (connection open, scripts loaded).
func hangingRedis(t *testing.T, cfg idempotency.Config) (*idempotency.Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, MaxRetries: 3})
	t.Cleanup(func() { _ = rdb.Close() })
	cfg.CallTimeout = 300 * time.Millisecond
	s, _ := newStore(t, rdb, cfg)
	claim, _, err := s.Begin(t.Context(), scope("warm-up"), "fp")
	require.NoError(t, err)
	require.NoError(t, claim.Finish(t.Context(), response("ok")))
	return s, srv
}

// A Redis that stops answering (not down: it takes the connection and the
// command) makes a keyed request answer 503 within CallTimeout, not after
// the client's read timeouts and retries; the claim it answers once it is
// back is released, so that the client's retry runs at once instead of
// waiting out the lease.
func TestBeginIsBoundedWhenRedisHangs(t *testing.T) {
	t.Parallel()
	s, srv := hangingRedis(t, idempotency.Config{WaitTimeout: 500 * time.Millisecond})
	srv.Freeze()
	start := time.Now()
	_, _, err := s.Begin(t.Context(), scope("hang"), "fp")
	require.ErrorIs(t, err, idempotency.ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second, "Begin waited for the client's timeouts")
	srv.Thaw()

	require.Eventually(t, func() bool {
		claim, replay, err := s.Begin(t.Context(), scope("hang"), "fp")
		if err != nil {
			return false // in progress: the late claim is not released yet
		}
		require.Nil(t, replay)
		require.NoError(t, claim.Finish(t.Context(), response("retried")))
		return true
	}, 10*time.Second, 50*time.Millisecond, "the late claim holds the key")
}

// A renewal stuck on a hanging Redis does not hold up FinishAsync (the
// request's answer waits for it), and the response is stored once Redis
// answers again.
func TestFinishAsyncDoesNotWaitForAStuckRenewal(t *testing.T) {
	t.Parallel()
	s, srv := hangingRedis(t, idempotency.Config{Lease: 600 * time.Millisecond})
	claim, _, err := s.Begin(t.Context(), scope("renewing"), "fp")
	require.NoError(t, err)
	srv.Freeze()
	time.Sleep(300 * time.Millisecond) // the first renewal (at 200 ms) is on its way
	start := time.Now()
	done := make(chan error, 1)
	claim.FinishAsync(response("stored"), func(err error) { done <- err })
	require.Less(t, time.Since(start), 100*time.Millisecond, "FinishAsync waited for the renewal")
	srv.Thaw()
	require.NoError(t, <-done)
	_, replay, err := s.Begin(t.Context(), scope("renewing"), "fp")
	require.NoError(t, err)
	require.Equal(t, "stored", string(replay.Body))
}

// A response waiting to be stored keeps its claim: the lease is renewed
// until the store lands, so a retry arriving meanwhile waits (and is
// answered with the response), however long the queue takes, instead of
// reclaiming the key and running again.
func TestQueuedResponseKeepsItsLease(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{Lease: 300 * time.Millisecond, WaitTimeout: 200 * time.Millisecond})
	ctx := t.Context()
	release := idempotency.HoldFinishes(s)
	claim, _, err := s.Begin(ctx, scope("queued"), "fp")
	require.NoError(t, err)
	done := make(chan error, 1)
	claim.FinishAsync(response("queued"), func(err error) { done <- err })
	time.Sleep(time.Second) // more than three leases in the queue

	_, _, err = s.Begin(ctx, scope("queued"), "fp")
	require.ErrorIs(t, err, idempotency.ErrInProgress, "the key was reclaimed while its response waited")
	release()
	require.NoError(t, <-done)
	_, replay, err := s.Begin(ctx, scope("queued"), "fp")
	require.NoError(t, err)
	require.Equal(t, "queued", string(replay.Body))
}

// TestReclaimOfAReclaimedKeyCoversTheFirstOwner: owner A claims and dies,
// B takes the key over and dies too before finishing; C's PreviousSince
// must reach back to A's claim, since A (not only B) may have committed
// the write, and the dead-owner check searches only that span.
func TestReclaimOfAReclaimedKeyCoversTheFirstOwner(t *testing.T) {
	t.Parallel()
	const lease = 300 * time.Millisecond
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{Lease: lease})
	ctx := t.Context()
	first := time.Now()
	a, _, err := s.Begin(ctx, scope("twice-dead"), "fp")
	require.NoError(t, err)
	a.Abandon()
	b, _, err := s.Begin(ctx, scope("twice-dead"), "fp")
	require.NoError(t, err)
	require.NotNil(t, b)
	require.Equal(t, a.Owner(), b.PreviousOwner())
	b.Abandon()
	c, _, err := s.Begin(ctx, scope("twice-dead"), "fp")
	require.NoError(t, err)
	require.NotNil(t, c)
	require.Equal(t, b.Owner(), c.PreviousOwner())
	require.GreaterOrEqual(t, c.PreviousSince(), 2*lease-50*time.Millisecond, "the span reaches back to A's claim")
	require.LessOrEqual(t, c.PreviousSince(), time.Since(first)+50*time.Millisecond)
	require.NoError(t, c.Finish(ctx, response("third")))
}

// A reclaim that Redis answers after Begin gave up (the call timeout, or
// the client went away) is released, but the key must still name a dead
// owner: the released claim never ran the check for the dead owner's
// writes, and a plain fresh claim for the retry would skip it too, running
// a write the dead owner may have committed a second time.
func TestLateReclaimKeepsTheDeadOwner(t *testing.T) {
	t.Parallel()
	s, srv := hangingRedis(t, idempotency.Config{Lease: 600 * time.Millisecond, WaitTimeout: 300 * time.Millisecond})
	ctx := t.Context()
	dead, _, err := s.Begin(ctx, scope("late-reclaim"), "fp")
	require.NoError(t, err)
	dead.Abandon()
	time.Sleep(700 * time.Millisecond) // its lease ran out

	srv.Freeze()
	_, _, err = s.Begin(ctx, scope("late-reclaim"), "fp")
	require.ErrorIs(t, err, idempotency.ErrUnavailable)
	srv.Thaw()

	var retry *idempotency.Claim
	require.Eventually(t, func() bool {
		claim, replay, err := s.Begin(ctx, scope("late-reclaim"), "fp")
		if err != nil {
			return false // in progress: the late reclaim is not released yet
		}
		require.Nil(t, replay)
		retry = claim
		return true
	}, 10*time.Second, 50*time.Millisecond, "the late reclaim holds the key")
	require.NotEmpty(t, retry.PreviousOwner(), "the retry claimed the key fresh: the dead owner's check is skipped")
	require.Positive(t, retry.PreviousSince(), "the span since the dead owner's claim is lost")
	require.NoError(t, retry.Finish(ctx, response("retried")))
}

// A release of a reclaimed claim leaves the key for the next request to
// reclaim at once, and a renewal of the releaser that reaches Redis after
// the release does not take the key back for a lease.
func TestReleaseOfAReclaimedKey(t *testing.T) {
	t.Parallel()
	rdb := redistest.Shared(t)
	s, _ := newStore(t, rdb, idempotency.Config{Lease: 300 * time.Millisecond, WaitTimeout: time.Second})
	ctx := t.Context()
	dead, _, err := s.Begin(ctx, scope("release-reclaimed"), "fp")
	require.NoError(t, err)
	dead.Abandon()
	reclaimed, _, err := s.Begin(ctx, scope("release-reclaimed"), "fp")
	require.NoError(t, err)
	require.Equal(t, dead.Owner(), reclaimed.PreviousOwner())
	since := reclaimed.PreviousSince()
	require.NoError(t, reclaimed.Release(ctx))
	require.ErrorIs(t, reclaimed.Release(ctx), idempotency.ErrNotOwner, "released once")

	next, replay, err := s.Begin(ctx, scope("release-reclaimed"), "fp")
	require.NoError(t, err, "the released key is claimable at once")
	require.Nil(t, replay)
	require.NotEmpty(t, next.PreviousOwner())
	require.GreaterOrEqual(t, next.PreviousSince(), since)
	require.NoError(t, next.Finish(ctx, response("next")))
}

// TestClaimCarriesQueuedResponses: a response FinishAsync queued is sent
// ahead of the next claim, in its pipeline, not only after the store's
// own delay (an hour here): its done has run when that Begin returns, and
// a duplicate of the queued response's key is answered with it at once
// instead of polling.
func TestClaimCarriesQueuedResponses(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{WaitTimeout: 100 * time.Millisecond})
	idempotency.SetRideDelay(s, time.Hour)
	ctx := t.Context()

	first, _, err := s.Begin(ctx, scope("ride-first"), "fp")
	require.NoError(t, err)
	done := make(chan error, 1)
	first.FinishAsync(response("first"), func(err error) { done <- err })
	require.Empty(t, done, "the response waits for a claim to carry it")

	other, _, err := s.Begin(ctx, scope("ride-other"), "fp")
	require.NoError(t, err)
	require.NotNil(t, other)
	require.Len(t, done, 1, "the claim of another key carried the queued response")
	require.NoError(t, <-done)

	second, _, err := s.Begin(ctx, scope("ride-second"), "fp")
	require.NoError(t, err)
	second.FinishAsync(response("second"), func(err error) { done <- err })
	_, replay, err := s.Begin(ctx, scope("ride-second"), "fp")
	require.NoError(t, err, "the duplicate found the response stored, it did not wait for it")
	require.NotNil(t, replay)
	require.Equal(t, "second", string(replay.Body))
	require.NoError(t, <-done)

	require.NoError(t, other.Finish(ctx, response("other")))
	require.NoError(t, s.Close(ctx))
}

// TestQueuedResponseIsStoredWithoutAClaim: with no claim to carry it, a
// queued response is stored after the store's delay.
func TestQueuedResponseIsStoredWithoutAClaim(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("ride-alone"), "fp")
	require.NoError(t, err)
	done := make(chan error, 1)
	claim.FinishAsync(response("alone"), func(err error) { done <- err })
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("a queued response was not stored without a claim to carry it")
	}
}

// slowFinishEval holds back, by delay, every command or pipeline that
// carries the finish script's source (EVAL after a NOSCRIPT answer), as a
// Redis that stalls right after answering a claim would.
type slowFinishEval struct{ delay time.Duration }

func (h slowFinishEval) hold(cmds ...redis.Cmder) {
	for _, c := range cmds {
		if a := c.Args(); len(a) > 1 && c.Name() == "eval" {
			if src, _ := a[1].(string); strings.Contains(src, "'state', 'done'") {
				time.Sleep(h.delay)
			}
		}
	}
}

func (slowFinishEval) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h slowFinishEval) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error { h.hold(c); return next(ctx, c) }
}
func (h slowFinishEval) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.hold(cmds...); return next(ctx, cmds) }
}

// TestClaimDoesNotWaitForTheResponsesItCarried: a claim answered in time
// returns at once even when the responses it carried are not answered yet
// (their script was not loaded, after a Redis restart or failover, and
// must be sent again): Begin waited for them, past its CallTimeout and its
// context, up to the 10 s of a batch.
func TestClaimDoesNotWaitForTheResponsesItCarried(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rdb := srv.Client()
	rdb.AddHook(slowFinishEval{delay: 2 * time.Second})
	s, _ := newStore(t, rdb, idempotency.Config{CallTimeout: 300 * time.Millisecond})
	idempotency.SetRideDelay(s, time.Hour)
	ctx := t.Context()

	first, _, err := s.Begin(ctx, scope("carried"), "fp")
	require.NoError(t, err)
	require.NoError(t, rdb.ScriptFlush(ctx).Err()) // as after a restart
	done := make(chan error, 1)
	first.FinishAsync(response("carried"), func(err error) { done <- err })

	start := time.Now()
	other, _, err := s.Begin(ctx, scope("carrier"), "fp")
	took := time.Since(start)
	require.NoError(t, err)
	require.Less(t, took, time.Second, "Begin waited %s for the responses it carried", took)
	require.NoError(t, <-done, "the carried response is stored all the same")
	require.NoError(t, other.Finish(ctx, response("carrier")))
	_, replay, err := s.Begin(ctx, scope("carried"), "fp")
	require.NoError(t, err)
	require.Equal(t, "carried", string(replay.Body))
	require.NoError(t, s.Close(ctx))
}

// TestFinishRunTwiceByItsOwner: a finish script that runs twice for the
// same owner (go-redis retries a command whose answer was lost) answers
// the second time that the response is stored, not ErrNotOwner, which
// the web layer logs as a take-over by a newer owner.
func TestFinishRunTwiceByItsOwner(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{})
	ctx := t.Context()
	claim, _, err := s.Begin(ctx, scope("finish-twice"), "fp")
	require.NoError(t, err)
	require.NoError(t, claim.Finish(ctx, response("once")))
	require.NoError(t, claim.Finish(ctx, response("once")), "the owner's own response is stored")
	_, replay, err := s.Begin(ctx, scope("finish-twice"), "fp")
	require.NoError(t, err)
	require.Equal(t, "once", string(replay.Body))
}

// The key of an owner that died outlives its lease by the TTL, also when
// the TTL is no longer than the lease: the next request takes it over (and
// learns the previous owner, so that it checks for that owner's writes)
// instead of claiming it afresh.
func TestDeadOwnersKeyOutlivesItsLease(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, redistest.Shared(t), idempotency.Config{TTL: 300 * time.Millisecond, Lease: 300 * time.Millisecond})
	ctx := t.Context()
	dead, _, err := s.Begin(ctx, scope("dead-owner-ttl"), "fp")
	require.NoError(t, err)
	dead.Abandon()
	time.Sleep(450 * time.Millisecond) // the lease ran out, the TTL after it did not
	claim, _, err := s.Begin(ctx, scope("dead-owner-ttl"), "fp")
	require.NoError(t, err)
	require.Equal(t, dead.Owner(), claim.PreviousOwner(), "the retry takes the dead owner's key over")
	require.NoError(t, claim.Finish(ctx, response("ok")))
}
