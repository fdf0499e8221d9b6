package idempotency_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/kumiko-go/kumiko/framework/idempotency"
	"github.com/kumiko-go/kumiko/internal/redistest"
)

// BenchmarkClaimFinish measures the Redis side of one keyed write with a
// fresh key, sequentially against the shared test Redis (keys under a
// prefix of their own, kept for a minute):
//
//   - framework: [idempotency.Store.Begin] claiming the key (one script
//     call) and [idempotency.Claim.Finish] storing a small response
//     (another), two round trips.
//   - raw-redis: a bare SET of a value of the same size with an expiry,
//     then a GET of it, also two round trips.
//
// What the framework adds is the scripts' work in Redis (the claim's
// checks, the response's hash) and its Go side (the owner id, the lease
// renewal it arms and stops, the header's JSON).
func BenchmarkClaimFinish(b *testing.B) {
	rdb := redistest.Shared(b)
	prefix := "kumiko-bench:idem:" + randomHex(6)
	s, err := idempotency.New(rdb, &idempotency.Config{Prefix: prefix, TTL: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	resp := idempotency.Response{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}},
		Body: []byte(`{"data":{"id":"0b9d2f6c-5a3e-4e7a-9c61-2f0f4b6a8d11"}}`)}
	var n int // keys stay fresh across the sub-benchmarks' runs
	b.Run("framework", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			n++
			claim, replay, err := s.Begin(ctx, scope("k"+strconv.Itoa(n)), "fp")
			if err != nil {
				b.Fatal(err)
			}
			if claim == nil {
				b.Fatalf("key %d replayed %v instead of being claimed", n, replay)
			}
			if err := claim.Finish(ctx, resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-redis", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			n++
			key := prefix + ":raw:" + strconv.Itoa(n)
			if err := rdb.Set(ctx, key, resp.Body, time.Minute).Err(); err != nil {
				b.Fatal(err)
			}
			if _, err := rdb.Get(ctx, key).Bytes(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.StopTimer()
	if err := s.Close(ctx); err != nil {
		b.Fatal(err)
	}
}
