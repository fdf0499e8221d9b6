package auth_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/kumiko-go/kumiko/framework/auth"
)

// BenchmarkVerify measures verifying one HS256 token; no I/O.
//
//   - cached: [auth.Keyring.Verify] of the same token on every call, the
//     case of a client that sends its token with every request (a lookup
//     in the keyring's memory of verified tokens and a copy of the roles).
//   - uncached: Verify of tokens the keyring has forgotten: one more token
//     than [auth.VerifiedCacheSize], verified in turn, so that every call
//     misses and checks the HMAC and decodes the claims, and then
//     remembers the token (evicting the oldest).
//   - raw-jwt: the baseline, golang-jwt's Parser alone on the same token
//     with the same options, into jwt.MapClaims, without the claims'
//     checks and the memory.
func BenchmarkVerify(b *testing.B) {
	kr, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret1}})
	if err != nil {
		b.Fatal(err)
	}
	p := auth.Principal{UserID: "user-1", TenantID: "tenant-1", Roles: []string{"admin"}}
	mint := func(b *testing.B, p auth.Principal) string {
		tok, err := kr.Mint(p, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		return tok
	}
	b.Run("cached", func(b *testing.B) {
		tok := mint(b, p)
		if _, err := kr.Verify(tok); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := kr.Verify(tok); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Distinct tokens (their users differ), minted on the first run of
	// the sub-benchmark (b.N grows over several runs) and verified in
	// turn across all runs, so that each was forgotten when it comes
	// round again.
	var toks []string
	next := 0
	b.Run("uncached", func(b *testing.B) {
		if toks == nil {
			toks = make([]string, auth.VerifiedCacheSize+1)
			for i := range toks {
				q := p
				q.UserID = "user-" + strconv.Itoa(i) + "-of-many"
				toks[i] = mint(b, q)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := kr.Verify(toks[next]); err != nil {
				b.Fatal(err)
			}
			next = (next + 1) % len(toks)
		}
	})
	b.Run("raw-jwt", func(b *testing.B) {
		tok := mint(b, p)
		parser := jwt.NewParser(jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(30*time.Second))
		key := func(*jwt.Token) (any, error) { return secret1, nil }
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := parser.Parse(tok, key); err != nil {
				b.Fatal(err)
			}
		}
	})
}
