package auth_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/kumiko-go/kumiko/framework/auth"
)

func ExampleKeyring_Mint() {
	kr, err := auth.NewKeyring([]auth.Key{{ID: "2025-06", Secret: []byte("a-long-random-secret-of-32-bytes")}})
	if err != nil {
		panic(err)
	}

	token, err := kr.Mint(auth.Principal{UserID: "alice", TenantID: "acme", Roles: []string{"admin"}}, 15*time.Minute)
	if err != nil {
		panic(err)
	}

	p, err := kr.Verify(token)
	if err != nil {
		panic(err)
	}
	fmt.Println(p.UserID, p.TenantID, p.Roles, p.HasRole("admin"))
	// Output: alice acme [admin] true
}

func ExampleKeyring_Verify() {
	kr, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: []byte("a-long-random-secret-of-32-bytes")}})
	if err != nil {
		panic(err)
	}

	_, err = kr.Verify("not-a-token")
	fmt.Println(errors.Is(err, auth.ErrUnauthorized))
	// Output: true
}

func ExampleNewKeyring_rotation() {
	oldKey := auth.Key{ID: "2025-01", Secret: []byte("the-old-secret-still-32-bytes-ok")}
	newKey := auth.Key{ID: "2025-06", Secret: []byte("the-new-secret-also-32-bytes-ok!")}

	before, _ := auth.NewKeyring([]auth.Key{oldKey})
	token, _ := before.Mint(auth.Principal{UserID: "alice", TenantID: "acme"}, time.Hour)

	// After rotation the new key signs and the old one still verifies.
	after, _ := auth.NewKeyring([]auth.Key{newKey, oldKey})
	p, err := after.Verify(token)
	fmt.Println(p.UserID, err)
	// Output: alice <nil>
}

func ExampleTokenFromRequest() {
	r := httptest.NewRequest(http.MethodPost, "/api/write", nil)
	r.AddCookie(&http.Cookie{Name: auth.CookieName, Value: "from-cookie"})
	fmt.Println(auth.TokenFromRequest(r))

	r.Header.Set("Authorization", "Bearer from-header")
	fmt.Println(auth.TokenFromRequest(r))
	// Output:
	// from-cookie
	// from-header
}
