package auth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
	lru "github.com/hashicorp/golang-lru/v2"
)

// CookieName is the name of the cookie that may carry the token when the
// request has no bearer Authorization header.
const CookieName = "kumiko_auth"

// ReservedTenantID is the framework's system tenant. It is used by the
// framework itself and can never be a caller's tenant: [Keyring.Verify]
// rejects tokens that claim it and [Keyring.Mint] refuses to sign them.
const ReservedTenantID = "system"

// MaxIDLength is the longest user id (sub) and tenant id (tenantId) a
// token may carry, in bytes: they go into the keys of indexes that every
// tenant's rows share, and one too large for a btree entry would fail the
// shared projections at its event, for every tenant. 255 is also OpenID
// Connect's bound on sub.
const MaxIDLength = 255

// defaultTTL is the lifetime Mint gives a token when asked for a non-positive
// ttl.
const defaultTTL = time.Hour

// leeway is the clock skew tolerated when checking exp, nbf and iat.
const leeway = 30 * time.Second

// ErrUnauthorized is wrapped by every error [Keyring.Verify] returns. The
// wrapping error's message names the reason, for logs; test for it with
// [errors.Is].
var ErrUnauthorized = errors.New("auth: unauthorized")

// Key is one HMAC secret, selected by the token header's `kid`. ID may be ""
// for a single unnamed key.
type Key struct {
	// ID is written to and matched against the token header's `kid`. An empty
	// ID means tokens signed with this key carry no `kid`.
	ID string
	// Secret is the HMAC-SHA256 secret. It must not be empty; use at least 32
	// random bytes.
	Secret []byte
}

// Principal is the authenticated caller.
type Principal struct {
	// UserID is the token's `sub` claim. Never empty and without U+FFFD
	// or NUL for a verified token.
	UserID string
	// TenantID is the token's `tenantId` claim. Never empty, never
	// [ReservedTenantID] and without U+FFFD or NUL, for a verified token.
	TenantID string
	// Roles is the token's `roles` claim; nil when the token has none.
	Roles []string
}

// HasRole reports whether p has the role.
func (p Principal) HasRole(role string) bool {
	return slices.Contains(p.Roles, role)
}

// HasAllRoles reports whether p has every one of roles. It reports true for
// an empty roles.
func (p Principal) HasAllRoles(roles []string) bool {
	for _, r := range roles {
		if !p.HasRole(r) {
			return false
		}
	}
	return true
}

// claims is the JWT payload.
type claims struct {
	TenantID string   `json:"tenantId"`
	Roles    []string `json:"roles"`
	jwt.RegisteredClaims
}

// Keyring verifies tokens against several keys (rotation) and signs with the
// first. Its keys are fixed at construction; it is safe for concurrent use.
type Keyring struct {
	keys   []Key
	byID   map[string][]byte
	parser *jwt.Parser
	// verified remembers tokens that passed verification, so a client
	// sending the same token on every request pays for the HMAC and the
	// JSON decoding once (about 20 µs and 30 allocations a request). Keyed by
	// the whole token, signature included: a token that differs in any
	// byte is verified afresh, and failures are never remembered.
	verified *lru.Cache[string, verifiedToken]
	// now is the clock; tests replace it.
	now func() time.Time
}

// verifiedToken is a remembered verification: the caller, and the instant
// (exp plus leeway) after which the token is expired. The other time
// claims (nbf, iat) only become easier to satisfy as time passes.
type verifiedToken struct {
	p        Principal
	notAfter time.Time
}

// VerifiedCacheSize is how many verified tokens a keyring remembers (the
// least recently used are forgotten first): at a few hundred bytes a
// token, about 4 MB.
const VerifiedCacheSize = 10_000

// NewKeyring returns a keyring over keys, which it copies. The first key signs;
// all of them verify. It returns an error when keys is empty, when a secret is
// empty, or when two keys share an ID.
func NewKeyring(keys []Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("auth: new keyring: no keys")
	}
	k := &Keyring{
		keys: make([]Key, 0, len(keys)),
		byID: make(map[string][]byte, len(keys)),
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(leeway),
		),
		now: time.Now,
	}
	jwt.WithTimeFunc(func() time.Time { return k.now() })(k.parser)
	cache, err := lru.New[string, verifiedToken](VerifiedCacheSize)
	if err != nil {
		return nil, fmt.Errorf("auth: new keyring: %w", err)
	}
	k.verified = cache
	for i, key := range keys {
		if len(key.Secret) == 0 {
			return nil, fmt.Errorf("auth: new keyring: key %d (id %q): empty secret", i, key.ID)
		}
		if _, dup := k.byID[key.ID]; dup {
			return nil, fmt.Errorf("auth: new keyring: key %d: duplicate id %q", i, key.ID)
		}
		secret := slices.Clone(key.Secret)
		k.keys = append(k.keys, Key{ID: key.ID, Secret: secret})
		k.byID[key.ID] = secret
	}
	return k, nil
}

// Mint returns an HS256 token for p signed with the first key, whose ID, when
// non-empty, goes into the header as `kid`. The token carries sub, tenantId,
// roles (always an array), iat (now) and exp (now + ttl); a ttl <= 0 means
// one hour. It returns an error when p has no UserID or TenantID, when its
// TenantID is [ReservedTenantID], or when either holds U+FFFD, bytes that
// are not UTF-8 or a NUL, since such a token could never verify.
func (k *Keyring) Mint(p Principal, ttl time.Duration) (string, error) {
	switch {
	case p.UserID == "":
		return "", errors.New("auth: mint: empty user id")
	case p.TenantID == "":
		return "", errors.New("auth: mint: empty tenant id")
	case p.TenantID == ReservedTenantID:
		return "", fmt.Errorf("auth: mint: tenant %q is reserved", ReservedTenantID)
	case strings.ContainsRune(p.UserID, utf8.RuneError), strings.ContainsRune(p.TenantID, utf8.RuneError):
		return "", errors.New("auth: mint: user or tenant id holds U+FFFD or bytes that are not UTF-8")
	case strings.ContainsRune(p.UserID, 0), strings.ContainsRune(p.TenantID, 0):
		return "", errors.New("auth: mint: user or tenant id holds a NUL")
	case len(p.UserID) > MaxIDLength, len(p.TenantID) > MaxIDLength:
		return "", fmt.Errorf("auth: mint: user or tenant id longer than %d bytes", MaxIDLength)
	}
	if ttl <= 0 {
		ttl = defaultTTL
	}
	roles := slices.Clone(p.Roles)
	if roles == nil {
		roles = []string{}
	}
	now := time.Now()
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims{
		TenantID: p.TenantID,
		Roles:    roles,
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   p.UserID,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
	})
	signer := k.keys[0]
	if signer.ID != "" {
		tok.Header["kid"] = signer.ID
	}
	s, err := tok.SignedString(signer.Secret)
	if err != nil {
		return "", fmt.Errorf("auth: mint: %w", err)
	}
	return s, nil
}

// Verify checks token and returns its caller. Only HS256 is accepted. The
// header's `kid`, when present, selects the key (an unknown kid fails);
// otherwise the first key is used. exp is required; exp, nbf and iat are
// checked with 30 seconds of leeway. sub and tenantId must be non-empty
// strings of at most [MaxIDLength] bytes without U+FFFD (the decoder's stand-in for a lone surrogate
// escape or a byte that is not UTF-8, which would make several spellings
// one tenant) and without NUL (which Postgres cannot store), tenantId must
// not be [ReservedTenantID], and roles, when present, must be an array of
// strings. A payload that holds one of these claims or of the registered
// ones twice, also in another case (say "tenantid" beside "tenantId"),
// fails: the JSON decoder would take the last of them, other readers of the
// token maybe another. Every failure wraps [ErrUnauthorized].
func (k *Keyring) Verify(token string) (Principal, error) {
	p, _, err := k.VerifyUntil(token)
	return p, err
}

// VerifyUntil is [Keyring.Verify] that also returns the instant the token
// stops verifying (its exp plus the leeway), so that a long-lived
// connection it opened (an SSE stream) can end then.
func (k *Keyring) VerifyUntil(token string) (Principal, time.Time, error) {
	if token == "" {
		return Principal{}, time.Time{}, fmt.Errorf("%w: missing token", ErrUnauthorized)
	}
	if v, ok := k.verified.Get(token); ok {
		if k.now().Before(v.notAfter) {
			return v.p.clone(), v.notAfter, nil
		}
		k.verified.Remove(token)
	}
	var c claims
	if _, err := k.parser.ParseWithClaims(token, &c, k.key); err != nil {
		// Not %w: the jwt library's errors are not part of this API.
		return Principal{}, time.Time{}, fmt.Errorf("%w: %s", ErrUnauthorized, err.Error())
	}
	if name, ok := outOfRangeTime(&c.RegisteredClaims); ok {
		return Principal{}, time.Time{}, fmt.Errorf("%w: %s is not a date between 1970 and 9999", ErrUnauthorized, name)
	}
	if name, ok := caseVariantClaim(token); ok {
		return Principal{}, time.Time{}, fmt.Errorf("%w: claim %q repeats a claim Kumiko reads (or a case variant of it)", ErrUnauthorized, name)
	}
	switch {
	case c.Subject == "":
		return Principal{}, time.Time{}, fmt.Errorf("%w: missing sub", ErrUnauthorized)
	case c.TenantID == "":
		return Principal{}, time.Time{}, fmt.Errorf("%w: missing tenantId", ErrUnauthorized)
	case c.TenantID == ReservedTenantID:
		return Principal{}, time.Time{}, fmt.Errorf("%w: tenant %q is reserved", ErrUnauthorized, ReservedTenantID)
	case strings.ContainsRune(c.Subject, utf8.RuneError):
		return Principal{}, time.Time{}, fmt.Errorf("%w: sub %s", ErrUnauthorized, replacedMessage)
	case strings.ContainsRune(c.TenantID, utf8.RuneError):
		return Principal{}, time.Time{}, fmt.Errorf("%w: tenantId %s", ErrUnauthorized, replacedMessage)
	case strings.ContainsRune(c.Subject, 0), strings.ContainsRune(c.TenantID, 0):
		return Principal{}, time.Time{}, fmt.Errorf("%w: sub or tenantId holds a NUL, which Postgres cannot store", ErrUnauthorized)
	case len(c.Subject) > MaxIDLength, len(c.TenantID) > MaxIDLength:
		return Principal{}, time.Time{}, fmt.Errorf("%w: sub or tenantId longer than %d bytes", ErrUnauthorized, MaxIDLength)
	}
	p := Principal{UserID: c.Subject, TenantID: c.TenantID}
	if len(c.Roles) > 0 {
		p.Roles = c.Roles
	}
	// WithExpirationRequired: exp is present.
	notAfter := c.ExpiresAt.Add(leeway)
	k.verified.Add(token, verifiedToken{p: p.clone(), notAfter: notAfter})
	return p, notAfter, nil
}

// maxNumericDate is 9999-12-31T23:59:59Z in seconds since the epoch.
const maxNumericDate = 253402300799

// outOfRangeTime reports a time claim (exp, nbf, iat) outside 1970..9999.
// The jwt library converts the claim's float to int64 seconds, which is
// undefined beyond int64's range and on amd64 yields the earliest instant:
// an "nbf" of 1e300 would read as long past, and the token valid now.
func outOfRangeTime(c *jwt.RegisteredClaims) (string, bool) {
	for _, d := range []struct {
		name string
		at   *jwt.NumericDate
	}{{"exp", c.ExpiresAt}, {"nbf", c.NotBefore}, {"iat", c.IssuedAt}} {
		if d.at != nil && (d.at.Unix() < 0 || d.at.Unix() > maxNumericDate) {
			return d.name, true
		}
	}
	return "", false
}

// replacedMessage says why a sub or tenantId holding U+FFFD fails: the JSON
// decoder puts U+FFFD for every lone UTF-16 surrogate escape ("\ud800") and
// every byte that is not UTF-8, so "shop\ud800" and "shop\udfff" (two
// tenants to an issuer whose strings keep lone surrogates, as JavaScript's
// do) would both be the tenant "shop\uFFFD" here and share its rows.
const replacedMessage = "holds U+FFFD (a lone surrogate escape or bytes that are not UTF-8 decode to it), so several spellings would name one caller"

// readClaims are the payload's claims Verify reads, spelled exactly.
var readClaims = []string{"sub", "tenantId", "roles", "exp", "nbf", "iat", "iss", "aud", "jti"}

// caseVariantClaim reports a claim of the (signature-checked) token's
// payload that appears more than once when case is folded: twice, or
// beside a variant spelling (one of readClaims). encoding/json, which
// decodes the claims, matches keys case-insensitively (ſ and K included)
// and lets the last match win, so "tenantid" after "tenantId" would choose
// the tenant, while other readers of the token (a browser client reading
// claims.tenantId, a gateway) may take another: a token of an issuer that
// lets users add claims of their own could name any tenant, role or
// expiry. A lone variant ("TenantId") is no ambiguity and passes, as
// before. A payload that does not decode as an object is reported too (it
// cannot have verified).
func caseVariantClaim(token string) (string, bool) {
	_, rest, _ := strings.Cut(token, ".")
	seg, _, _ := strings.Cut(rest, ".")
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return "", true
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", true
	}
	seen := make(map[string]int, len(readClaims))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", true
		}
		name, _ := tok.(string)
		for _, want := range readClaims {
			if strings.EqualFold(name, want) {
				if seen[want]++; seen[want] > 1 {
					return name, true
				}
			}
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", true
		}
	}
	return "", false
}

// clone returns p with its own copy of the roles, so that a caller changing
// them cannot change a remembered verification.
func (p Principal) clone() Principal {
	p.Roles = slices.Clone(p.Roles)
	return p
}

// key is the jwt.Keyfunc: it picks the secret named by the header's kid, or
// the first key when there is none.
func (k *Keyring) key(t *jwt.Token) (any, error) {
	if _, ok := t.Method.(*jwt.SigningMethodHMAC); !ok {
		return nil, fmt.Errorf("unexpected signing method %v", t.Header["alg"])
	}
	if _, ok := t.Header["crit"]; ok {
		// RFC 7515 §4.1.11: a recipient must refuse extensions it does not
		// understand, and this keyring understands none (b64 among them).
		return nil, errors.New("critical header extensions (crit) are not supported")
	}
	raw, ok := t.Header["kid"]
	if !ok {
		return k.keys[0].Secret, nil
	}
	kid, ok := raw.(string)
	if !ok {
		return nil, errors.New("kid is not a string")
	}
	secret, ok := k.byID[kid]
	if !ok {
		return nil, fmt.Errorf("unknown kid %q", kid)
	}
	return secret, nil
}

// TokenFromRequest returns the bearer token of the Authorization header
// ("Bearer x", scheme case-insensitive), else the kumiko_auth cookie value,
// else "". An Authorization header with another scheme or an empty token is
// ignored.
func TokenFromRequest(r *http.Request) string {
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		if tok = strings.TrimSpace(tok); tok != "" {
			return tok
		}
	}
	if c, err := r.Cookie(CookieName); err == nil {
		return c.Value
	}
	return ""
}
