package web_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// signedPayload signs a raw JSON payload (written byte for byte, as an
// issuer other than Go's encoder may write it) with the test key "k1".
func signedPayload(key []byte, payload string) string {
	b64 := base64.RawURLEncoding.EncodeToString
	unsigned := b64([]byte(`{"alg":"HS256","kid":"k1","typ":"JWT"}`)) + "." + b64([]byte(payload))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(unsigned))
	return unsigned + "." + b64(mac.Sum(nil))
}

// TestTenantClaimsThatDecodeAlike: Go's JSON decoder turns a lone UTF-16
// surrogate escape ("\ud800") and a byte that is not UTF-8 into U+FFFD, so
// the tenants "shop\ud800" and "shop\udfff" (two tenants to an issuer
// written in JavaScript, whose strings keep lone surrogates) or "shop\xff"
// and "shop\xfe" would both be the tenant "shop\uFFFD" here, and each would
// see the other's orders. Such a tenantId (or sub) is 401, and another
// spelling's order is never visible.
func TestTenantClaimsThatDecodeAlike(t *testing.T) {
	t.Parallel()
	b := setup(t)
	iat, exp := time.Now().Add(-time.Minute).Unix(), time.Now().Add(time.Hour).Unix()
	tokenOf := func(sub, tenant string) string {
		return signedPayload(secret, fmt.Sprintf(`{"sub":"%s","tenantId":"%s","roles":[],"iat":%d,"exp":%d}`, sub, tenant, iat, exp))
	}
	pairs := []struct{ name, victim, attacker string }{
		{"lone surrogates", `shop\ud800`, `shop\udfff`},
		{"bytes that are not UTF-8", "shop\xff", "shop\xfe"},
		{"a lone surrogate and U+FFFD itself", `shop\ud800`, `shop\ufffd`},
	}
	for i, p := range pairs {
		victim, attacker := tokenOf("u", p.victim), tokenOf("u", p.attacker)
		secretCustomer := fmt.Sprintf("VICTIM-SECRET-%d", i)
		placed := b.post(t, "/api/write", victim, placeBody(map[string]any{"customer": secretCustomer}))
		listed := b.post(t, "/api/query", attacker, map[string]any{"type": "orders:query:list", "payload": map[string]any{}})
		require.NotContains(t, string(listed.body), secretCustomer, "%s: another tenant's order is visible", p.name)
		require.Equal(t, http.StatusUnauthorized, placed.status, "%s: the victim's token: %s", p.name, placed.body)
		require.Equal(t, http.StatusUnauthorized, listed.status, "%s: the attacker's token: %s", p.name, listed.body)
	}
	// A user id that decodes alike is refused too (idempotency keys and
	// event metadata are per user).
	res := b.post(t, "/api/query", tokenOf(`u\ud800`, "shop"), map[string]any{"type": "orders:query:list", "payload": map[string]any{}})
	require.Equal(t, http.StatusUnauthorized, res.status, "%s", res.body)
	// A tenant with other non-ASCII letters is fine.
	res = b.post(t, "/api/query", tokenOf("u", `caf\u00e9-\u65e5\u672c`), map[string]any{"type": "orders:query:list", "payload": map[string]any{}})
	require.Equal(t, http.StatusOK, res.status, "%s", res.body)
}

// TestTenantClaimWithNUL: Postgres cannot store a NUL, so a token whose
// tenantId or sub holds one ("\u0000") can never scope a transaction or
// record its user; it is 401, not a 500 internal error on every request.
func TestTenantClaimWithNUL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	iat, exp := time.Now().Add(-time.Minute).Unix(), time.Now().Add(time.Hour).Unix()
	for _, c := range []struct{ sub, tenant string }{{"u", `shop\u0000`}, {`u\u0000`, "shop"}} {
		tok := signedPayload(secret, fmt.Sprintf(`{"sub":"%s","tenantId":"%s","roles":[],"iat":%d,"exp":%d}`, c.sub, c.tenant, iat, exp))
		res := b.post(t, "/api/write", tok, placeBody(map[string]any{"customer": "A"}))
		res.requireError(t, http.StatusUnauthorized, "unauthorized")
	}
	b.requireRows(t, 0, 0)
}
