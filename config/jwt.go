package config

import (
	"errors"
	"fmt"
	"strings"
)

// MinJWTSecretLen is the minimum length in bytes of every JWT secret.
const MinJWTSecretLen = 16

// JWTKey is one HS256 key: a secret and the key id ("kid" header) that
// names it during rotation.
type JWTKey struct {
	// ID is the key id. It is "" for the single unnamed key of the
	// one-secret form of JWT_SECRET, and non-empty in the list form.
	ID string
	// Secret is the HMAC secret, at least [MinJWTSecretLen] bytes.
	Secret []byte
}

// String returns the key id and hides the secret, so that logging a key or
// a [Config] never prints it.
func (k JWTKey) String() string {
	return fmt.Sprintf("JWTKey{ID: %q, Secret: [redacted %d bytes]}", k.ID, len(k.Secret))
}

// GoString is [JWTKey.String], for the %#v verb.
func (k JWTKey) GoString() string { return k.String() }

// ParseJWTKeys parses the value of JWT_SECRET. It has two forms:
//
//   - one secret: the whole value is the secret of a single key with an
//     empty ID. It must contain neither ':' nor ','.
//   - a list "kid1:secret1,kid2:secret2": comma-separated entries, each a key
//     id and a secret split at the first ':'. The first key signs new
//     tokens; all of them verify, which is how keys are rotated. Key ids
//     must be non-empty, unique, and made of ASCII letters, digits, '.', '_'
//     and '-'. Secrets may contain ':' but not ','.
//
// The value is taken as is: no whitespace is trimmed. Every secret must be
// at least [MinJWTSecretLen] bytes long. On failure ParseJWTKeys returns nil
// and an [errors.Join] of one error per problem; the errors name entries by
// position and never quote any part of s, which may be a secret mistyped.
func ParseJWTKeys(s string) ([]JWTKey, error) {
	keys, errs := parseJWTKeys(s)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return keys, nil
}

func parseJWTKeys(s string) ([]JWTKey, []error) {
	if s == "" {
		return nil, []error{errors.New("is empty")}
	}
	if !strings.ContainsAny(s, ":,") {
		if len(s) < MinJWTSecretLen {
			return nil, []error{fmt.Errorf("secret must be at least %d bytes, got %d", MinJWTSecretLen, len(s))}
		}
		return []JWTKey{{Secret: []byte(s)}}, nil
	}

	var (
		errs []error
		keys []JWTKey
		seen = map[string]int{}
	)
	for i, entry := range strings.Split(s, ",") {
		n := i + 1
		id, secret, found := strings.Cut(entry, ":")
		switch {
		case entry == "":
			errs = append(errs, fmt.Errorf("entry %d is empty (want kid:secret)", n))
			continue
		case !found:
			errs = append(errs, fmt.Errorf("entry %d has no ':' (want kid:secret in the list form; a single secret must contain neither ':' nor ',')", n))
			continue
		case id == "":
			errs = append(errs, fmt.Errorf("entry %d has an empty key id", n))
		case !validKeyID(id):
			errs = append(errs, fmt.Errorf("entry %d: key id may contain only ASCII letters, digits, '.', '_' and '-'", n))
		default:
			if first, dup := seen[id]; dup {
				errs = append(errs, fmt.Errorf("entry %d: key id is already used by entry %d", n, first))
			} else {
				seen[id] = n
			}
		}
		if len(secret) < MinJWTSecretLen {
			errs = append(errs, fmt.Errorf("entry %d: secret must be at least %d bytes, got %d", n, MinJWTSecretLen, len(secret)))
		}
		keys = append(keys, JWTKey{ID: id, Secret: []byte(secret)})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return keys, nil
}

func validKeyID(id string) bool {
	for _, r := range id {
		switch {
		case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '.', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}
