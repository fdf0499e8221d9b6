// Package auth verifies and mints the HS256 JSON Web Tokens that authenticate
// callers of Kumiko's HTTP surface.
//
// # Tokens
//
// A token is an HS256 JWT whose claims are:
//
//   - sub: the caller's user id (required, non-empty);
//   - tenantId: the caller's tenant (required, non-empty, never [ReservedTenantID]);
//   - roles: an optional array of role names;
//   - iat, exp: issue and expiry times (exp is required).
//
// Verified claims become a [Principal].
//
// # Keys and rotation
//
// A [Keyring] holds one or more HMAC secrets ([Key]). It always signs with the
// first key and writes that key's ID into the token header as `kid`. When
// verifying, the `kid` header selects the key; a token without `kid` is checked
// against the first key. To rotate, put the new key first and keep the old one
// after it until every token it signed has expired:
//
//	kr, err := auth.NewKeyring([]auth.Key{
//		{ID: "2025-06", Secret: newSecret}, // signs new tokens
//		{ID: "2025-01", Secret: oldSecret}, // still verifies old ones
//	})
//
// A key with an empty ID signs tokens without `kid`, which only the first key
// verifies: to move from it to several keys, first give it an ID (its tokens
// still verify, new ones carry the ID), and add the new key in front once the
// tokens it signed without `kid` have expired.
//
// # Transport
//
// A client presents its token either as `Authorization: Bearer <token>` or in
// the [CookieName] cookie; [TokenFromRequest] extracts it, preferring the
// header.
//
// # Errors
//
// Every verification failure wraps [ErrUnauthorized]. The message carries the
// reason (expired, bad signature, unknown key, ...) for logs; it is not meant
// for the client, which should only ever see "unauthorized".
package auth
