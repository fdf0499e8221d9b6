package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
)

// BenchmarkWrite measures one orders:write:place (an orders row and an
// event in one transaction) on a fresh database, sequentially:
//
//   - http: POST /api/write served in-process by the server's handler
//     (echo and the middleware, the bearer token, which the keyring
//     remembers after the first request, the JSON body and response),
//     into an httptest.ResponseRecorder: no socket.
//   - runtime: the same command through [framework.Runtime.WriteWithToken]
//     with the caller and payload already decoded, as the handler calls it.
//
// The difference is the HTTP layer's Go work per write; the database's
// share is the same on both sides. cmd/kumiko-bench's http-write figure
// measures the whole path under load, sockets included.
func BenchmarkWrite(b *testing.B) {
	db := kumikotest.NewDB(b)
	reg := framework.NewRegistry()
	orders.Register(reg)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	if err != nil {
		b.Fatal(err)
	}
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret}})
	if err != nil {
		b.Fatal(err)
	}
	h := web.New(rt, keys, nil).Handler()
	principal := auth.Principal{UserID: "u-acme", TenantID: "acme"}
	token, err := keys.Mint(principal, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	payload := json.RawMessage(`{"customer":"bench","amountCents":100}`)
	body := `{"type":"orders:write:place","payload":` + string(payload) + `}`

	b.Run("http", func(b *testing.B) {
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			req := httptest.NewRequest(http.MethodPost, "/api/write", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+token)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
	b.Run("runtime", func(b *testing.B) {
		ctx := context.Background()
		cmds := []framework.Command{{Type: "orders:write:place", Payload: payload}}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, _, err := rt.WriteWithToken(ctx, framework.Call{Principal: principal, RequestID: "bench"}, cmds); err != nil {
				b.Fatal(err)
			}
		}
	})
}
