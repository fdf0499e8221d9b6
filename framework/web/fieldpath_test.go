package web_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
)

// The payload of the field path tests: nested structs and pointers, slices
// of structs, a map, embedded structs (promoted and tagged), a time, a
// json:"-" field.
type (
	zipCode struct {
		Zip string `json:"zip" validate:"omitempty,len=5"`
	}
	lineItem struct {
		SKU string `json:"sku" validate:"required"`
		Qty int    `json:"qty" validate:"gte=0"`
	}
	Audit struct {
		By string `json:"by" validate:"omitempty,max=3"`
	}
	shopping struct {
		Audit
		Note    *Audit              `json:"note"`
		Address zipCode             `json:"address"`
		Items   []lineItem          `json:"items" validate:"dive"`
		ByKey   map[string]lineItem `json:"byKey" validate:"dive"`
		At      time.Time           `json:"at"`
		Secret  string              `json:"-" validate:"required"`
	}
)

// Every validation_error answered for a payload names the offending field
// by its JSON path, as the client wrote it, through /api/write, /api/batch
// and /api/query alike.
func TestValidationErrorsNameTheFieldByItsJSONPath(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("shop")
	framework.Write(f, "buy", func(context.Context, *framework.Tx, shopping) (map[string]bool, error) {
		return map[string]bool{"ok": true}, nil
	}, nil)
	framework.Query(f, "find", func(context.Context, *framework.Tx, shopping) (map[string]bool, error) {
		return map[string]bool{"ok": true}, nil
	}, nil)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret}})
	require.NoError(t, err)
	srv := httptest.NewServer(web.New(rt, keys, nil).Handler())
	t.Cleanup(srv.Close)
	b := &bundle{db: db, url: srv.URL, client: srv.Client(), keys: keys}
	tok := b.token(t, "t1")

	for payload, want := range map[string][2]string{
		`{"by":5}`:                                  {"by", "by must be of type string, got number"},
		`{"by":"Ada Lovelace"}`:                     {"by", "by must be at most 3 characters"},
		`{"note":{"by":"Ada Lovelace"}}`:            {"note.by", "note.by must be at most 3 characters"},
		`{"address":{"zip":"1"}}`:                   {"address.zip", `address.zip fails rule "len=5"`},
		`{"address":{"zip":1}}`:                     {"address.zip", "address.zip must be of type string, got number"},
		`{"address":{"zipp":"1"}}`:                  {"address.zipp", `unknown field "address.zipp"`},
		`{"items":[{"sku":"a"},{"sku":5}]}`:         {"items[1].sku", "items[1].sku must be of type string, got number"},
		`{"items":[{"sku":"a"},{"sku":""}]}`:        {"items[1].sku", "items[1].sku is required"},
		`{"items":[{"sku":"a"},{"sku":"b","x":1}]}`: {"items[1].x", `unknown field "items[1].x"`},
		`{"byKey":{"k":{"sku":"a","qty":-1}}}`:      {"byKey.k.qty", "byKey.k.qty must be >= 0"},
		`{"at":5}`:                                  {"at", "at is not valid: Time.UnmarshalJSON: input is not a JSON string"},
	} {
		check := func(res response, prefix string) {
			t.Helper()
			env := res.requireError(t, http.StatusBadRequest, "validation_error")
			fields, ok := env.Error.Details["fields"].([]any)
			require.True(t, ok, "%s: %s", payload, res.body)
			require.Len(t, fields, 1, "%s: %s", payload, res.body)
			field := fields[0].(map[string]any)
			require.Equal(t, want[0], field["field"], "%s: %s", payload, res.body)
			require.Equal(t, want[1], field["message"], "%s: %s", payload, res.body)
			require.Equal(t, prefix+"validation failed: "+want[1], env.Error.Message, payload)
		}
		check(b.post(t, "/api/write", tok, `{"type":"shop:write:buy","payload":`+payload+`}`), "")
		check(b.post(t, "/api/query", tok, `{"type":"shop:query:find","payload":`+payload+`}`), "")
		res := b.post(t, "/api/batch", tok, `{"commands":[{"type":"shop:write:buy","payload":{}},{"type":"shop:write:buy","payload":`+payload+`}]}`)
		check(res, "command 1: ")
		require.Contains(t, string(res.body), `"index":1`)
	}
	// The json:"-" field is no part of the payload: its tag is not the client's to meet.
	b.post(t, "/api/write", tok, `{"type":"shop:write:buy","payload":{}}`).requireData(t, &map[string]bool{})
}
