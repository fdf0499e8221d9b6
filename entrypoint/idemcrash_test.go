package entrypoint_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// keyedCrashAPIs starts two api processes, api-1 and api-2 (with the
// extra settings env1 and env2), on db and a private Redis, waits until
// both are ready and returns them with a client of that Redis.
func keyedCrashAPIs(t *testing.T, db *kumikotest.DB, env1, env2 []string) (api1, api2 *proc, rdb *redis.Client) {
	t.Helper()
	rds := redistest.Start(t)
	redisURL := "redis://" + rds.Addr() + "/0"
	api1 = start(t, "api-1", procEnv("api", db.URL, redisURL, "api-1", env1...))
	api2 = start(t, "api-2", procEnv("api", db.URL, redisURL, "api-2", env2...))
	api1.waitReady(t)
	api2.waitReady(t)
	return api1, api2, rds.Client()
}

// holdAppends makes every append to db wait: a SHARE lock on the events
// table, held until the returned transaction ends (at the latest when the
// test ends).
func holdAppends(t *testing.T, db *kumikotest.DB) pgx.Tx {
	t.Helper()
	hold, err := db.Pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(context.Background()) })
	_, err = hold.Exec(context.Background(), `LOCK TABLE events IN SHARE MODE`)
	require.NoError(t, err)
	return hold
}

// postKeyed sends a keyed write (Idempotency-Key key) of tenant's user.
func postKeyed(ctx context.Context, t *testing.T, url, tenant, key string, body any) (int, []byte, error) {
	t.Helper()
	return post(ctx, t, url, tenant, body, "Idempotency-Key", key)
}

// TestKeyedWriteCommittedByAKilledProcessDoesNotRunAgain: an API process
// commits a keyed write and is killed with SIGKILL before the response
// reached the idempotency store (here: Redis writes are paused meanwhile).
// Once the dead owner's lease has run out, the client's retry with the same
// key on the other API process must not run the write a second time: the
// log keeps one order, and the retry says the write was committed.
func TestKeyedWriteCommittedByAKilledProcessDoesNotRunAgain(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	api1, api2, rdb := keyedCrashAPIs(t, db, nil, nil)
	ctx := context.Background()

	const key = "order-crash-0001"
	redisKey := "kumiko:idem:acme:u-acme:" + key
	body := map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 4200}}
	countPlaced := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'orders:event:placed'`).Scan(&n))
		return n
	}

	// Hold the write between its claim and its commit: a SHARE lock on
	// the events table blocks its append.
	hold := holdAppends(t, db)

	type answer struct {
		code int
		body []byte
		err  error
	}
	first := make(chan answer, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		code, b, err := postKeyed(rctx, t, api1.url+"/api/write", "acme", key, body)
		first <- answer{code, b, err}
	}()
	require.Eventually(t, func() bool {
		st, err := rdb.HGet(ctx, redisKey, "state").Result()
		return err == nil && st == "pending"
	}, wait, 10*time.Millisecond, "api-1 claims the key")

	// Redis takes no writes now: the response api-1 is about to store
	// stays in flight until the process dies.
	require.NoError(t, rdb.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err())
	require.NoError(t, hold.Rollback(ctx))
	a := <-first
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.code, string(a.body))
	require.Equal(t, 1, countPlaced())
	api1.kill()
	require.NoError(t, rdb.Do(ctx, "CLIENT", "UNPAUSE").Err())
	st, err := rdb.HGet(ctx, redisKey, "state").Result()
	require.NoError(t, err)
	require.Equal(t, "pending", st, "the killed owner's response never reached the store")

	// The dead owner's lease runs out (30 s; here at once).
	require.NoError(t, rdb.HSet(ctx, redisKey, "lease", 0).Err())

	// The client did not get its answer and retries on the other API.
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	code, retry, err := postKeyed(rctx, t, api2.url+"/api/write", "acme", key, body)
	require.NoError(t, err)
	require.Equal(t, 1, countPlaced(), "the retry ran the committed write again (%d %s)", code, retry)
	require.Equal(t, http.StatusConflict, code, string(retry))
	require.Contains(t, string(retry), "committed")

	// Later retries get the same answer, replayed.
	code2, again, err := postKeyed(rctx, t, api2.url+"/api/write", "acme", key, body)
	require.NoError(t, err)
	require.Equal(t, code, code2)
	require.Equal(t, string(retry), string(again), "replayed byte for byte")
	require.Equal(t, 1, countPlaced())
}

// TestKeyedWriteOfAKilledProcessBlockedInTheDatabaseDoesNotCommitLater: an
// API process sends a keyed write whose statements (and its COMMIT, which
// travels in the same pipeline) wait in the database for a lock, and is
// killed with SIGKILL meanwhile. Its server backend outlives it, still
// holding that COMMIT. Once the dead owner's lease has run out, the client's
// retry on the other API must not run the write beside it: it waits for
// the dead owner's transaction to end, finds the order it committed, and
// answers that the write was committed. The log keeps one order.
func TestKeyedWriteOfAKilledProcessBlockedInTheDatabaseDoesNotCommitLater(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	// One connection, which the warm-up writes below have run the write's
	// statements on: they are prepared there, so the whole transaction up
	// to its COMMIT goes out in one pipeline.
	api1, api2, rdb := keyedCrashAPIs(t, db, []string{"DATABASE_POOL_MAX", "1"}, nil)
	ctx := context.Background()
	for range 3 {
		api1.place(t, "acme", "warm-up")
	}

	const key = "order-crash-0002"
	redisKey := "kumiko:idem:acme:u-acme:" + key
	body := map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 4200}}
	count := func(q string) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, q).Scan(&n))
		return n
	}
	placed := `SELECT count(*) FROM events WHERE type = 'orders:event:placed' AND payload->>'customer' = 'Ada'`
	// Backends of this database waiting for a lock (the events table's or
	// an advisory one).
	waiting := `SELECT count(*) FROM pg_locks WHERE NOT granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

	// Every append waits: a SHARE lock on the events table.
	hold := holdAppends(t, db)

	go func() {
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, _, _ = postKeyed(rctx, t, api1.url+"/api/write", "acme", key, body)
	}()
	require.Eventually(t, func() bool { return count(waiting) == 1 }, wait, 10*time.Millisecond,
		"api-1's write waits for the lock")
	st, err := rdb.HGet(ctx, redisKey, "state").Result()
	require.NoError(t, err)
	require.Equal(t, "pending", st)
	api1.kill()
	// The process is gone; its backend is not.
	time.Sleep(time.Second)
	require.Equal(t, 1, count(waiting), "the killed process's backend still waits")

	// The dead owner's lease runs out (30 s; here at once).
	require.NoError(t, rdb.HSet(ctx, redisKey, "lease", 0).Err())

	type answer struct {
		code int
		body []byte
		err  error
	}
	retried := make(chan answer, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		code, b, err := postKeyed(rctx, t, api2.url+"/api/write", "acme", key, body)
		retried <- answer{code, b, err}
	}()
	// The retry waits too: for the dead owner's transaction, or (running
	// the write again) for the events table.
	require.Eventually(t, func() bool { return count(waiting) == 2 }, wait, 10*time.Millisecond,
		"the retry waits for a lock")
	require.NoError(t, hold.Rollback(ctx))
	a := <-retried
	require.NoError(t, a.err)
	require.Eventually(t, func() bool { return count(waiting) == 0 }, wait, 10*time.Millisecond)
	require.Equal(t, 1, count(placed), "the retry ran the write beside the killed process's (%d %s)", a.code, a.body)
	require.Equal(t, http.StatusConflict, a.code, string(a.body))
	require.Contains(t, string(a.body), "committed")
}

// TestKeyedWriteOfAKilledProcessIsRememberedPastItsLease: with the shortest
// KUMIKO_IDEMPOTENCY_TTL (30 s, the claim's lease), an API process commits
// a keyed write and is killed before its response reached the store. Its
// key must outlive the lease that now runs out on its own: a retry after
// the lease takes the key over and finds the committed write (409
// committed), instead of finding no key at all and running the write again.
func TestKeyedWriteOfAKilledProcessIsRememberedPastItsLease(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	ttl := []string{"KUMIKO_IDEMPOTENCY_TTL", "30s"}
	api1, api2, rdb := keyedCrashAPIs(t, db, ttl, ttl)
	ctx := context.Background()

	const key = "order-crash-0003"
	redisKey := "kumiko:idem:acme:u-acme:" + key
	body := map[string]any{"type": "orders:write:place", "payload": map[string]any{"customer": "Ada", "amountCents": 4200}}
	countPlaced := func() int {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE type = 'orders:event:placed'`).Scan(&n))
		return n
	}

	hold := holdAppends(t, db)
	first := make(chan int, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		code, _, _ := postKeyed(rctx, t, api1.url+"/api/write", "acme", key, body)
		first <- code
	}()
	require.Eventually(t, func() bool {
		st, err := rdb.HGet(ctx, redisKey, "state").Result()
		return err == nil && st == "pending"
	}, wait, 10*time.Millisecond, "api-1 claims the key")
	require.NoError(t, rdb.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err())
	require.NoError(t, hold.Rollback(ctx))
	require.Equal(t, http.StatusOK, <-first)
	api1.kill()
	require.NoError(t, rdb.Do(ctx, "CLIENT", "UNPAUSE").Err())
	require.Equal(t, 1, countPlaced())

	// The client retries until the dead owner's lease has run out (each
	// retry waits up to 10 s, then answers 409 "in progress").
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rctx, cancel := context.WithTimeout(ctx, wait)
		code, retry, err := postKeyed(rctx, t, api2.url+"/api/write", "acme", key, body)
		cancel()
		require.NoError(t, err)
		if code == http.StatusConflict && strings.Contains(string(retry), "in progress") && time.Now().Before(deadline) {
			continue
		}
		require.Equal(t, 1, countPlaced(), "the retry after the lease ran the committed write again (%d %s)", code, retry)
		require.Equal(t, http.StatusConflict, code, string(retry))
		require.Contains(t, string(retry), `"committed":true`)
		return
	}
}
