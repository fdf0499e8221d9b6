package sse_test

import (
	"io"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
)

// TestStreamEndsWhenTokenExpires: a stream lives no longer than the token
// that opened it (its exp plus the verifier's 30 s of leeway); the client
// reconnects with a fresh token, or gets 401.
func TestStreamEndsWhenTokenExpires(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// Past its exp, but within the leeway for about six more seconds (room
	// for the event on a loaded machine).
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "u1", "tenantId": "acme",
		"iat": time.Now().Add(-time.Hour).Unix(), "exp": time.Now().Add(-24 * time.Second).Unix()})
	tok.Header["kid"] = "k1"
	signed, err := tok.SignedString([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)

	c := b.connect(t, request{token: signed})
	b.note(t, "acme", "memo", 1, "while valid")
	c.waitFor(t, 1)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the stream outlived its token")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	require.ErrorIs(t, c.err, io.EOF, "the stream ends normally")
}
