package framework_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

// fuzzInner is embedded, exported and unexported, to exercise promoted
// fields.
type fuzzInner struct {
	N int `json:"n"`
}

type fuzzPromoted struct {
	P uint8 `json:"p"`
}

type fuzzItem struct {
	SKU string  `json:"sku" validate:"required,max=10"`
	Qty int16   `json:"qty" validate:"gte=0"`
	At  *string `json:"at,omitempty"`
}

// fuzzPayload has most shapes a payload can take.
type fuzzPayload struct {
	fuzzInner
	*fuzzPromoted
	Name    string              `json:"name" validate:"max=20"`
	Amount  int64               `json:"amount,string"`
	Items   []fuzzItem          `json:"items" validate:"dive"`
	ByKey   map[string]fuzzItem `json:"byKey"`
	Counts  map[uint8]int       `json:"counts"`
	When    time.Time           `json:"when"`
	Any     any                 `json:"any"`
	Shape   interface{ M() }    `json:"shape"`
	Fixed   [2]float32          `json:"fixed"`
	Raw     json.RawMessage     `json:"raw"`
	Num     json.Number         `json:"num"`
	Skipped string              `json:"-" validate:"required"`
}

// FuzzDecodePayload: whatever the client sends, DecodePayload answers
// nil or a *ValidationError whose fields are named; it never panics.
func FuzzDecodePayload(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"n":1,"p":300}`, `{"items":[{"sku":"a"},{"sku":5}]}`, `{"byKey":{"a.b":{"qty":"x"}}}`,
		`{"counts":{"a":1}}`, `{"counts":{"300":1}}`, `{"when":5}`, `{"shape":{}}`, `{"fixed":[1,2,3]}`,
		`{"amount":"12x"}`, `{"amount":12}`, `{"num":true}`, `{"NAME":"x","name":"y"}`, `[1,2]`, `"x"`,
		`{"items":[{"sku":"aaaaaaaaaaaaaaaaaa","qty":-1}]}`, `{"zzz":1}`, `{"items":{"sku":1}}`, `null`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		var p fuzzPayload
		err := framework.DecodePayload(payload, &p)
		if err == nil {
			return
		}
		var ve *framework.ValidationError
		if !errors.As(err, &ve) || len(ve.Fields) == 0 {
			t.Fatalf("payload %q: %T %v, want a *ValidationError with fields", payload, err, err)
		}
		for _, fe := range ve.Fields {
			if fe.Message == "" {
				t.Fatalf("payload %q: field error without a message: %+v", payload, fe)
			}
		}
	})
}

// TestLargeBadPayloadIsNotWalked: a payload over 64 KiB that fails to
// decode is not walked again to place its error (the walk cost about 0.6 s
// of CPU for a bad 1 MiB payload): it is named as encoding/json names it,
// without the element's index.
func TestLargeBadPayloadIsNotWalked(t *testing.T) {
	t.Parallel()
	small := `{"items":[{"sku":"a"},{"sku":5}]}`
	large := `{"items":[` + strings.Repeat(`{"sku":"a","qty":1},`, 5000) + `{"sku":5}]}`
	for payload, field := range map[string]string{small: "items[1].sku", large: "items.sku"} {
		var p fuzzPayload
		var ve *framework.ValidationError
		require.ErrorAs(t, framework.DecodePayload([]byte(payload), &p), &ve)
		require.Len(t, ve.Fields, 1)
		require.Equal(t, field, ve.Fields[0].Field, "payload of %d bytes", len(payload))
	}
}
