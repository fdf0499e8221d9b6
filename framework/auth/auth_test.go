package auth_test

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/auth"
)

var (
	secret1 = []byte("k1-secret-0123456789abcdef0123456789")
	secret2 = []byte("k2-secret-0123456789abcdef0123456789")
)

func newKeyring(t *testing.T, keys ...auth.Key) *auth.Keyring {
	t.Helper()
	kr, err := auth.NewKeyring(keys)
	require.NoError(t, err)
	return kr
}

// validClaims returns claims that verify; tests delete or override fields.
func validClaims() jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"sub":      "user-1",
		"tenantId": "tenant-1",
		"roles":    []string{"admin"},
		"iat":      now.Unix(),
		"exp":      now.Add(time.Hour).Unix(),
	}
}

// sign builds a token with an arbitrary method, key and kid ("" = no kid).
func sign(t *testing.T, method jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	require.NoError(t, err)
	return s
}

func requireUnauthorized(t *testing.T, kr *auth.Keyring, token string) {
	t.Helper()
	p, err := kr.Verify(token)
	require.ErrorIs(t, err, auth.ErrUnauthorized)
	require.Zero(t, p)
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})

	want := auth.Principal{UserID: "user-1", TenantID: "tenant-1", Roles: []string{"admin", "editor"}}
	tok, err := kr.Mint(want, time.Minute)
	require.NoError(t, err)

	got, err := kr.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, want, got)

	// Header and claims are what the contract says.
	var c jwt.MapClaims
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, &c)
	require.NoError(t, err)
	require.Equal(t, "HS256", parsed.Header["alg"])
	require.Equal(t, "k1", parsed.Header["kid"])
	require.Equal(t, "user-1", c["sub"])
	require.Equal(t, "tenant-1", c["tenantId"])
	require.Equal(t, []any{"admin", "editor"}, c["roles"])
	require.InDelta(t, 60, c["exp"].(float64)-c["iat"].(float64), 1)
}

func TestMintNoRolesAndDefaultTTL(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{Secret: secret1})

	tok, err := kr.Mint(auth.Principal{UserID: "u", TenantID: "t"}, 0)
	require.NoError(t, err)

	var c jwt.MapClaims
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, &c)
	require.NoError(t, err)
	require.NotContains(t, parsed.Header, "kid", "unnamed key writes no kid")
	require.Equal(t, []any{}, c["roles"], "roles is always an array")
	require.InDelta(t, time.Hour.Seconds(), c["exp"].(float64)-c["iat"].(float64), 1)

	p, err := kr.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, auth.Principal{UserID: "u", TenantID: "t"}, p)
}

func TestMintRejectsInvalidPrincipal(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})

	for name, p := range map[string]auth.Principal{
		"no user":         {TenantID: "t"},
		"no tenant":       {UserID: "u"},
		"reserved tenant": {UserID: "u", TenantID: auth.ReservedTenantID},
		"U+FFFD tenant":   {UserID: "u", TenantID: "shop\ufffd"},
		"non-UTF-8 user":  {UserID: "u\xff", TenantID: "t"},
		"NUL tenant":      {UserID: "u", TenantID: "t\x00"},
		"long tenant":     {UserID: "u", TenantID: strings.Repeat("t", auth.MaxIDLength+1)},
		"long user":       {UserID: strings.Repeat("u", auth.MaxIDLength+1), TenantID: "t"},
	} {
		_, err := kr.Mint(p, time.Minute)
		require.Error(t, err, name)
	}
}

func TestNewKeyringErrors(t *testing.T) {
	t.Parallel()

	_, err := auth.NewKeyring(nil)
	require.ErrorContains(t, err, "no keys")

	_, err = auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret1}, {ID: "k2"}})
	require.ErrorContains(t, err, "empty secret")

	_, err = auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret1}, {ID: "k1", Secret: secret2}})
	require.ErrorContains(t, err, "duplicate id")
}

func TestNewKeyringCopiesSecrets(t *testing.T) {
	t.Parallel()
	secret := []byte("mutable-secret-0123456789abcdef")
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret})
	tok, err := kr.Mint(auth.Principal{UserID: "u", TenantID: "t"}, time.Minute)
	require.NoError(t, err)

	secret[0] ^= 0xff
	_, err = kr.Verify(tok)
	require.NoError(t, err)
}

func TestRotation(t *testing.T) {
	t.Parallel()
	old := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	rotated := newKeyring(t, auth.Key{ID: "k2", Secret: secret2}, auth.Key{ID: "k1", Secret: secret1})
	p := auth.Principal{UserID: "u", TenantID: "t", Roles: []string{"r"}}

	oldTok, err := old.Mint(p, time.Minute)
	require.NoError(t, err)
	got, err := rotated.Verify(oldTok)
	require.NoError(t, err)
	require.Equal(t, p, got)

	// New tokens are signed with k2, which the old keyring does not know.
	newTok, err := rotated.Mint(p, time.Minute)
	require.NoError(t, err)
	_, err = rotated.Verify(newTok)
	require.NoError(t, err)
	requireUnauthorized(t, old, newTok)

	// Unknown kid, even with a secret the keyring holds.
	requireUnauthorized(t, rotated, sign(t, jwt.SigningMethodHS256, secret1, "k3", validClaims()))

	// A kid that is not a string.
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, validClaims())
	tok.Header["kid"] = 1
	s, err := tok.SignedString(secret1)
	require.NoError(t, err)
	requireUnauthorized(t, rotated, s)
}

// TestRotationFromOneUnnamedSecret is the path README.md documents for
// leaving the one-secret form of JWT_SECRET: its tokens carry no kid, and
// a token without kid is checked against the first key only, so the new
// key cannot go in front at once; the secret first gets an id.
func TestRotationFromOneUnnamedSecret(t *testing.T) {
	t.Parallel()
	p := auth.Principal{UserID: "u", TenantID: "t"}
	single := newKeyring(t, auth.Key{Secret: secret1})
	unnamedTok, err := single.Mint(p, time.Minute)
	require.NoError(t, err)

	// In one step, every token of the single secret stops verifying.
	requireUnauthorized(t, newKeyring(t, auth.Key{ID: "new", Secret: secret2}, auth.Key{ID: "old", Secret: secret1}), unnamedTok)

	// Step 1: name the secret. Its old tokens still verify; new ones carry
	// the id.
	named := newKeyring(t, auth.Key{ID: "old", Secret: secret1})
	_, err = named.Verify(unnamedTok)
	require.NoError(t, err)
	namedTok, err := named.Mint(p, time.Minute)
	require.NoError(t, err)

	// Step 2, once the unnamed tokens expired: the new key in front.
	rotated := newKeyring(t, auth.Key{ID: "new", Secret: secret2}, auth.Key{ID: "old", Secret: secret1})
	got, err := rotated.Verify(namedTok)
	require.NoError(t, err)
	require.Equal(t, p, got)
}

func TestNoKidUsesFirstKey(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k2", Secret: secret2}, auth.Key{ID: "k1", Secret: secret1})

	p, err := kr.Verify(sign(t, jwt.SigningMethodHS256, secret2, "", validClaims()))
	require.NoError(t, err)
	require.Equal(t, auth.Principal{UserID: "user-1", TenantID: "tenant-1", Roles: []string{"admin"}}, p)

	// Without kid only the first key is tried.
	requireUnauthorized(t, kr, sign(t, jwt.SigningMethodHS256, secret1, "", validClaims()))
}

func TestAlgNoneRejected(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{Secret: secret1})

	enc := base64.RawURLEncoding.EncodeToString
	payload := `{"sub":"user-1","tenantId":"tenant-1","exp":9999999999}`
	for _, header := range []string{
		`{"alg":"none","typ":"JWT"}`,
		`{"alg":"None","typ":"JWT"}`,
		`{"alg":"","typ":"JWT"}`,
		`{"typ":"JWT"}`,
	} {
		base := enc([]byte(header)) + "." + enc([]byte(payload))
		requireUnauthorized(t, kr, base+".")
		requireUnauthorized(t, kr, base)
	}
}

func TestForgedSignatureRejected(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})

	// Signed with another secret under the right kid.
	requireUnauthorized(t, kr, sign(t, jwt.SigningMethodHS256, []byte("attacker-secret"), "k1", validClaims()))

	// A genuine token whose payload was swapped.
	tok, err := kr.Mint(auth.Principal{UserID: "u", TenantID: "t"}, time.Minute)
	require.NoError(t, err)
	forged := sign(t, jwt.SigningMethodHS256, []byte("x"), "k1", jwt.MapClaims{
		"sub": "u", "tenantId": "other", "exp": time.Now().Add(time.Hour).Unix(),
	})
	genuine := splitToken(t, tok)
	swapped := splitToken(t, forged)
	requireUnauthorized(t, kr, genuine[0]+"."+swapped[1]+"."+genuine[2])

	// Signature stripped or corrupted.
	requireUnauthorized(t, kr, genuine[0]+"."+genuine[1]+".")
	requireUnauthorized(t, kr, genuine[0]+"."+genuine[1]+"."+corrupt(genuine[2]))
}

// corrupt changes the first character of a base64url signature, which
// always changes the first decoded byte (a fixed replacement of the last
// characters left one signature in about a thousand as it was).
func corrupt(sig string) string {
	c := byte('A')
	if sig[0] == c {
		c = 'B'
	}
	return string(c) + sig[1:]
}

func splitToken(t *testing.T, tok string) [3]string {
	t.Helper()
	var parts [3]string
	i := 0
	start := 0
	for j := range len(tok) {
		if tok[j] == '.' {
			parts[i] = tok[start:j]
			i++
			start = j + 1
		}
	}
	require.Equal(t, 2, i)
	parts[2] = tok[start:]
	return parts
}

func TestOtherAlgorithmsRejected(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})

	requireUnauthorized(t, kr, sign(t, jwt.SigningMethodHS512, secret1, "k1", validClaims()))
	requireUnauthorized(t, kr, sign(t, jwt.SigningMethodHS384, secret1, "k1", validClaims()))

	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	requireUnauthorized(t, kr, sign(t, jwt.SigningMethodRS256, rsaKey, "k1", validClaims()))
}

func TestTimeClaims(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	now := time.Now()

	with := func(key string, v any) string {
		c := validClaims()
		if v == nil {
			delete(c, key)
		} else {
			c[key] = v
		}
		return sign(t, jwt.SigningMethodHS256, secret1, "k1", c)
	}

	requireUnauthorized(t, kr, with("exp", now.Add(-2*time.Minute).Unix()))
	requireUnauthorized(t, kr, with("exp", nil))
	requireUnauthorized(t, kr, with("exp", "tomorrow"))
	requireUnauthorized(t, kr, with("nbf", now.Add(2*time.Minute).Unix()))
	requireUnauthorized(t, kr, with("iat", now.Add(2*time.Minute).Unix()))

	// Within the leeway.
	for _, tok := range []string{
		with("exp", now.Add(-5*time.Second).Unix()),
		with("nbf", now.Add(5*time.Second).Unix()),
		with("iat", now.Add(5*time.Second).Unix()),
		with("iat", nil),
	} {
		_, err := kr.Verify(tok)
		require.NoError(t, err)
	}
}

func TestIdentityClaims(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})

	with := func(key string, v any) string {
		c := validClaims()
		if v == nil {
			delete(c, key)
		} else {
			c[key] = v
		}
		return sign(t, jwt.SigningMethodHS256, secret1, "k1", c)
	}

	requireUnauthorized(t, kr, with("sub", nil))
	requireUnauthorized(t, kr, with("sub", ""))
	requireUnauthorized(t, kr, with("sub", 42))
	requireUnauthorized(t, kr, with("tenantId", nil))
	requireUnauthorized(t, kr, with("tenantId", ""))
	requireUnauthorized(t, kr, with("tenantId", 42))
	requireUnauthorized(t, kr, with("tenantId", auth.ReservedTenantID))
	requireUnauthorized(t, kr, with("roles", "admin"))
	requireUnauthorized(t, kr, with("roles", []any{"admin", 1}))
	// Ids go into the keys of indexes, shared by every tenant's rows; one
	// too large for a btree entry would stop a shared projection.
	requireUnauthorized(t, kr, with("tenantId", strings.Repeat("é", auth.MaxIDLength/2+1)))
	requireUnauthorized(t, kr, with("sub", strings.Repeat("u", auth.MaxIDLength+1)))
	p, err := kr.Verify(with("tenantId", strings.Repeat("é", auth.MaxIDLength/2)))
	require.NoError(t, err, "%d bytes", auth.MaxIDLength)
	require.Len(t, p.TenantID, auth.MaxIDLength-1)
	p, err = kr.Verify(with("sub", strings.Repeat("u", auth.MaxIDLength)))
	require.NoError(t, err)
	require.Len(t, p.UserID, auth.MaxIDLength)

	p, err = kr.Verify(with("roles", nil))
	require.NoError(t, err)
	require.Nil(t, p.Roles)
}

func TestVerifyGarbage(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	for _, tok := range []string{"", "x", "a.b", "a.b.c", "a.b.c.d", "...", "Bearer x"} {
		requireUnauthorized(t, kr, tok)
	}
}

func TestTokenFromRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header string
		cookie string
		want   string
	}{
		{name: "nothing", want: ""},
		{name: "bearer", header: "Bearer abc", want: "abc"},
		{name: "scheme case-insensitive", header: "bEaReR abc", want: "abc"},
		{name: "extra spaces", header: "Bearer   abc ", want: "abc"},
		{name: "cookie", cookie: "fromcookie", want: "fromcookie"},
		{name: "bearer wins over cookie", header: "Bearer abc", cookie: "fromcookie", want: "abc"},
		{name: "basic falls back to cookie", header: "Basic dXNlcjpwYXNz", cookie: "fromcookie", want: "fromcookie"},
		{name: "basic alone", header: "Basic dXNlcjpwYXNz", want: ""},
		{name: "empty bearer falls back to cookie", header: "Bearer ", cookie: "fromcookie", want: "fromcookie"},
		{name: "scheme without token", header: "Bearer", want: ""},
		{name: "scheme prefix only", header: "Bearerabc", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodGet, "/api/query", nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			if tt.cookie != "" {
				r.AddCookie(&http.Cookie{Name: auth.CookieName, Value: tt.cookie})
			}
			require.Equal(t, tt.want, auth.TokenFromRequest(r))
		})
	}
}

func TestRoles(t *testing.T) {
	t.Parallel()
	p := auth.Principal{UserID: "u", TenantID: "t", Roles: []string{"admin", "editor"}}

	require.True(t, p.HasRole("admin"))
	require.False(t, p.HasRole("owner"))
	require.False(t, p.HasRole(""))
	require.True(t, p.HasAllRoles([]string{"admin", "editor"}))
	require.False(t, p.HasAllRoles([]string{"admin", "owner"}))
	require.True(t, p.HasAllRoles(nil))
	require.False(t, auth.Principal{}.HasRole("admin"))
}

func FuzzVerify(f *testing.F) {
	kr, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret1}, {Secret: secret2}})
	require.NoError(f, err)
	valid, err := kr.Mint(auth.Principal{UserID: "u", TenantID: "t", Roles: []string{"r"}}, time.Hour)
	require.NoError(f, err)

	enc := base64.RawURLEncoding.EncodeToString
	for _, seed := range []string{
		valid,
		"",
		"a.b.c",
		enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(`{"sub":"u","tenantId":"t","exp":9999999999}`)) + ".",
		enc([]byte(`{"alg":"HS256","kid":{}}`)) + "." + enc([]byte(`{"roles":[1]}`)) + ".x",
		enc([]byte(`{"alg":"HS256","kid":"k1"}`)) + "." + enc([]byte(`null`)) + ".x",
	} {
		f.Add(seed)
	}

	f.Fuzz(func(t *testing.T, token string) {
		p, err := kr.Verify(token)
		if err != nil {
			require.ErrorIs(t, err, auth.ErrUnauthorized)
			require.Zero(t, p)
			return
		}
		require.NotEmpty(t, p.UserID)
		require.NotEmpty(t, p.TenantID)
		require.NotEqual(t, auth.ReservedTenantID, p.TenantID)
	})
}

// TestVerifiedTokensRemembered: a token verifies from the keyring's memory
// only while it is valid, byte for byte, and a caller cannot change what is
// remembered.
func TestVerifiedTokensRemembered(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	now := time.Now()
	auth.SetClock(kr, func() time.Time { return now })
	c := validClaims()
	c["exp"] = now.Add(time.Minute).Unix()
	tok := sign(t, jwt.SigningMethodHS256, secret1, "k1", c)

	p, err := kr.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, []string{"admin"}, p.Roles)
	p.Roles[0] = "changed-by-caller"
	again, err := kr.Verify(tok)
	require.NoError(t, err)
	require.Equal(t, auth.Principal{UserID: "user-1", TenantID: "tenant-1", Roles: []string{"admin"}}, again)

	// The same claims with a forged signature do not match the remembered token.
	forged := tok[:len(tok)-4] + "AAAA"
	if forged == tok {
		forged = tok[:len(tok)-4] + "BBBB"
	}
	requireUnauthorized(t, kr, forged)

	// Within the leeway after exp it still verifies; past it, it fails
	// although it verified before.
	now = now.Add(time.Minute + 20*time.Second)
	_, err = kr.Verify(tok)
	require.NoError(t, err)
	now = now.Add(15 * time.Second)
	requireUnauthorized(t, kr, tok)
	requireUnauthorized(t, kr, tok)
}

func TestVerifyUntil(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	c := validClaims()
	c["exp"] = exp.Unix()
	tok := sign(t, jwt.SigningMethodHS256, secret1, "k1", c)
	// Verified afresh, then from the keyring's memory: the same instant,
	// exp plus the 30 s leeway.
	for range 2 {
		p, until, err := kr.VerifyUntil(tok)
		require.NoError(t, err)
		require.Equal(t, "user-1", p.UserID)
		require.True(t, exp.Add(30*time.Second).Equal(until), "until %v", until)
	}
	_, until, err := kr.VerifyUntil("not-a-token")
	require.ErrorIs(t, err, auth.ErrUnauthorized)
	require.Zero(t, until)
}

// rawToken signs a payload given as JSON text, keys in the given order
// (a MapClaims would sort them).
func rawToken(t *testing.T, secret []byte, kid, payload string) string {
	t.Helper()
	hdr := `{"alg":"HS256","typ":"JWT"}`
	if kid != "" {
		hdr = `{"alg":"HS256","kid":"` + kid + `","typ":"JWT"}`
	}
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString([]byte(hdr)) + "." + enc.EncodeToString([]byte(payload))
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(signing))
	return signing + "." + enc.EncodeToString(mac.Sum(nil))
}

// TestCaseVariantClaimsRejected: encoding/json matches object keys to
// struct fields case-insensitively (and folds ſ to s, K to k), the last
// match winning, so a token whose payload holds "tenantId": "tenant-1"
// and, after it, "tenantid": "tenant-2" would verify as tenant-2 while
// every client reading claims.tenantId (the demo page, Kumiko's browser
// clients, a gateway) takes it for tenant-1. An issuer that lets a user
// add claims of their own would let that user pick a tenant, a role or an
// expiry. Such a token is rejected.
func TestCaseVariantClaimsRejected(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	now := time.Now()
	base := fmt.Sprintf(`"sub":"user-1","tenantId":"tenant-1","roles":[],"iat":%d,"exp":%d`, now.Unix(), now.Add(time.Hour).Unix())

	p, err := kr.Verify(rawToken(t, secret1, "k1", "{"+base+"}"))
	require.NoError(t, err, "the plain token verifies")
	require.Equal(t, "tenant-1", p.TenantID)

	for _, extra := range []string{
		`"tenantid":"tenant-2"`,
		`"TENANTID":"tenant-2"`,
		`"roleſ":["admin"]`,
		`"Sub":"user-2"`,
		fmt.Sprintf(`"EXP":%d`, now.Add(1000*time.Hour).Unix()),
	} {
		requireUnauthorized(t, kr, rawToken(t, secret1, "k1", "{"+base+","+extra+"}"))
	}
	// The same claim twice: which one a reader takes depends on the reader.
	requireUnauthorized(t, kr, rawToken(t, secret1, "k1", "{"+base+`,"tenantId":"tenant-2"}`))
	// A lone variant spelling is no ambiguity: it verifies, as it did.
	p, err = kr.Verify(rawToken(t, secret1, "k1", fmt.Sprintf(`{"sub":"user-1","TenantId":"tenant-3","roles":[],"exp":%d}`, now.Add(time.Hour).Unix())))
	require.NoError(t, err)
	require.Equal(t, "tenant-3", p.TenantID)
	// Claims of other names are no concern of the verifier.
	p, err = kr.Verify(rawToken(t, secret1, "k1", "{"+base+`,"tenantName":"x","email":"a@b"}`))
	require.NoError(t, err)
	require.Equal(t, "tenant-1", p.TenantID)
}

// A header naming critical extensions must be refused (RFC 7515 §4.1.11):
// the keyring understands none, so it cannot honour what they demand.
func TestVerifyRefusesCriticalExtensions(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	for _, crit := range []any{[]string{"b64"}, []string{"exp"}, []string{}, "b64"} {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, validClaims())
		tok.Header["kid"] = "k1"
		tok.Header["crit"] = crit
		tok.Header["b64"] = false
		s, err := tok.SignedString(secret1)
		require.NoError(t, err)
		requireUnauthorized(t, kr, s)
	}
}

// Time claims beyond what a date can hold are refused, not wrapped around
// into the past: nbf 1e300 must not make a token valid now.
func TestVerifyRefusesOutOfRangeTimes(t *testing.T) {
	t.Parallel()
	kr := newKeyring(t, auth.Key{ID: "k1", Secret: secret1})
	for _, name := range []string{"nbf", "iat", "exp"} {
		for _, v := range []any{1e300, -1e300, 1e19} {
			c := validClaims()
			c[name] = v
			requireUnauthorized(t, kr, sign(t, jwt.SigningMethodHS256, secret1, "k1", c))
		}
	}
}
