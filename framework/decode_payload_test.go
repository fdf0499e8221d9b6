package framework_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

// A payload that is not an object at all (a string, an array, a number)
// has no field to name: its message names the payload, rather than
// reading "validation failed:  must be of type object, got string".
func TestDecodePayloadOfTheWrongKindNamesThePayload(t *testing.T) {
	t.Parallel()
	type input struct {
		Customer string `json:"customer"`
	}
	for raw, kind := range map[string]string{`"x"`: "string", `[1]`: "array", `5`: "number", `true`: "bool"} {
		var in input
		err := framework.DecodePayload(json.RawMessage(raw), &in)
		var ve *framework.ValidationError
		require.ErrorAs(t, err, &ve, raw)
		require.Equal(t, "payload must be of type object, got "+kind, ve.Fields[0].Message, raw)
		require.Equal(t, "validation failed: payload must be of type object, got "+kind, framework.ToError(err).Message, raw)
	}
}

// A value of the wrong JSON kind is named by the kind the field takes, from
// the field's Go kind rather than its type's name: a named string type or a
// netip.Addr (text) takes a string, a time.Duration an integer (not "object"); an
// integer field given 1.5 or 300 for a uint8 says it takes an integer (and
// which), not "must be of type number, got number".
func TestDecodePayloadNamesTheKindAFieldTakes(t *testing.T) {
	t.Parallel()
	type status string
	type input struct {
		Count  int64         `json:"count"`
		Level  uint8         `json:"level"`
		Ratio  float64       `json:"ratio"`
		Status status        `json:"status"`
		Addr   netip.Addr    `json:"addr"`
		Wait   time.Duration `json:"wait"`
		Tags   []string      `json:"tags"`
		Blob   []byte        `json:"blob"`
		Flag   *bool         `json:"flag"`
		Inner  struct{}      `json:"inner"`
		Amount json.Number   `json:"amount"`
	}
	for raw, want := range map[string]string{
		`{"count":1.5}`:                  "count must be of type integer, got number 1.5",
		`{"count":1e2}`:                  "count must be of type integer, got number 1e2",
		`{"count":"3"}`:                  "count must be of type integer, got string",
		`{"count":99999999999999999999}`: "count must be an integer from -9223372036854775808 to 9223372036854775807, got 99999999999999999999",
		`{"level":300}`:                  "level must be an integer from 0 to 255, got 300",
		`{"level":-1}`:                   "level must be an integer from 0 to 255, got -1",
		`{"ratio":"x"}`:                  "ratio must be of type number, got string",
		`{"status":5}`:                   "status must be of type string, got number",
		`{"addr":5}`:                     "addr must be of type string, got number",
		`{"wait":"1s"}`:                  "wait must be of type integer, got string",
		`{"tags":"a"}`:                   "tags must be of type array, got string",
		`{"blob":5}`:                     "blob must be of type string, got number",
		`{"flag":"yes"}`:                 "flag must be of type boolean, got string",
		`{"inner":[]}`:                   "inner must be of type object, got array",
		`{"amount":true}`:                "amount must be of type number, got bool",
	} {
		var in input
		err := framework.DecodePayload(json.RawMessage(raw), &in)
		var ve *framework.ValidationError
		require.ErrorAs(t, err, &ve, raw)
		require.Len(t, ve.Fields, 1, raw)
		require.Equal(t, want, ve.Fields[0].Message, raw)
		require.Equal(t, "type", ve.Fields[0].Rule, raw)
	}
}

// The payload shapes of the field path tests: nested and pointed-to
// structs, slices and arrays of them, maps, embedded structs (exported and
// not, by value and by pointer, promoted and tagged), a json:"-" field and
// a non-empty interface.
type (
	pathAddress struct {
		Zip string `json:"zip" validate:"omitempty,len=5"`
	}
	pathItem struct {
		SKU string `json:"sku" validate:"required"`
		Qty int    `json:"qty" validate:"gte=0"`
	}
	PathPromoted struct {
		N int `json:"n" validate:"gte=0"`
	}
	PathPointed struct {
		P int `json:"p" validate:"gte=0"`
	}
	pathUnexported struct {
		U int `json:"u" validate:"gte=0"`
	}
	PathTagged struct {
		T int `json:"t" validate:"gte=0"`
	}
	pathShape interface{ Area() float64 }
	pathInput struct {
		PathPromoted
		*PathPointed
		pathUnexported
		PathTagged `json:"tagged"`
		Customer   string              `validate:"max=3"`
		Address    pathAddress         `json:"address"`
		Billing    *pathAddress        `json:"billing"`
		Items      []pathItem          `json:"items" validate:"dive"`
		ItemPtrs   []*pathItem         `json:"itemPtrs" validate:"dive"`
		Pair       [2]pathItem         `json:"pair"`
		ByKey      map[string]pathItem `json:"byKey" validate:"dive"`
		Counts     map[int]int         `json:"counts"`
		Levels     map[uint8]int       `json:"levels"`
		At         time.Time           `json:"at"`
		ID         uuid.UUID           `json:"id"`
		Shape      pathShape           `json:"shape"`
		Amount     int                 `json:"amount,string"`
		Email      string              `json:"email,omitempty" validate:"omitempty,email"`
		Secret     string              `json:"-" validate:"required"`
	}
)

// A field error names the field by its JSON path as the client wrote it:
// through embedded structs (not "PathPromoted.n"), with the index of a slice
// or array element (not "items.sku"), the key of a map entry, the object an
// unknown field sits in; and a value a custom or text unmarshaler refuses
// (a time, a UUID) names its field rather than failing the whole payload.
func TestDecodePayloadNamesTheFieldByItsJSONPath(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]framework.FieldError{
		`{"n":"x"}`:                          {Field: "n", Rule: "type", Param: "integer", Message: "n must be of type integer, got string"},
		`{"p":"x"}`:                          {Field: "p", Rule: "type", Param: "integer", Message: "p must be of type integer, got string"},
		`{"u":"x"}`:                          {Field: "u", Rule: "type", Param: "integer", Message: "u must be of type integer, got string"},
		`{"tagged":{"t":"x"}}`:               {Field: "tagged.t", Rule: "type", Param: "integer", Message: "tagged.t must be of type integer, got string"},
		`{"customer":5}`:                     {Field: "customer", Rule: "type", Param: "string", Message: "customer must be of type string, got number"},
		`{"billing":{"zip":5}}`:              {Field: "billing.zip", Rule: "type", Param: "string", Message: "billing.zip must be of type string, got number"},
		`{"items":[{},{},{"sku":5}]}`:        {Field: "items[2].sku", Rule: "type", Param: "string", Message: "items[2].sku must be of type string, got number"},
		`{"itemPtrs":[null,{"qty":1.5}]}`:    {Field: "itemPtrs[1].qty", Rule: "type", Param: "integer", Message: "itemPtrs[1].qty must be of type integer, got number 1.5"},
		`{"pair":[{},{"qty":"1"}]}`:          {Field: "pair[1].qty", Rule: "type", Param: "integer", Message: "pair[1].qty must be of type integer, got string"},
		`{"items":[{"sku":"a"},7]}`:          {Field: "items[1]", Rule: "type", Param: "object", Message: "items[1] must be of type object, got number"},
		`{"byKey":{"k":{"sku":5}}}`:          {Field: "byKey.k.sku", Rule: "type", Param: "string", Message: "byKey.k.sku must be of type string, got number"},
		`{"byKey":{"a.b":{"sku":5}}}`:        {Field: `byKey["a.b"].sku`, Rule: "type", Param: "string", Message: `byKey["a.b"].sku must be of type string, got number`},
		`{"address":{"zipp":"1"}}`:           {Field: "address.zipp", Rule: "unknown", Message: `unknown field "address.zipp"`},
		`{"items":[{"sku":"a"},{"skux":1}]}`: {Field: "items[1].skux", Rule: "unknown", Message: `unknown field "items[1].skux"`},
		`{"Secret":"x"}`:                     {Field: "Secret", Rule: "unknown", Message: `unknown field "Secret"`},
		`{"counts":{"1":1,"a":2}}`:           {Field: "counts", Rule: "type", Param: "integer", Message: `counts keys must be integers, got "a"`},
		`{"levels":{"300":1}}`:               {Field: "levels", Rule: "type", Param: "integer", Message: `levels keys must be integers from 0 to 255, got "300"`},
		`{"at":5}`:                           {Field: "at", Rule: "json", Message: "at is not valid: Time.UnmarshalJSON: input is not a JSON string"},
		`{"id":"nope"}`:                      {Field: "id", Rule: "json", Message: "id is not valid: invalid UUID length: 4"},
		`{"shape":{}}`:                       {Field: "shape", Rule: "type", Param: "null", Message: "shape cannot be decoded from JSON (it takes only null), got object"},
		`{"amount":5}`:                       {Field: "amount", Rule: "type", Param: "string", Message: "amount must be of type string holding an integer, got number"},
		`{"amount":"x"}`:                     {Field: "amount", Rule: "type", Param: "string", Message: "amount must be of type string holding an integer, got string"},
	} {
		var in pathInput
		err := framework.DecodePayload(json.RawMessage(raw), &in)
		var ve *framework.ValidationError
		require.ErrorAs(t, err, &ve, raw)
		require.Equal(t, []framework.FieldError{want}, ve.Fields, raw)
	}
}

// A validator tag's failure names the field by its JSON path too: a field
// promoted from an embedded struct by its own name (not "PathPromoted.n"),
// a map entry by its key; a json:"-" field is no part of the payload (the
// client can neither send nor fix it), so its tags are not the payload's.
func TestValidatePayloadNamesTheFieldByItsJSONPath(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		`{"n":-1}`:                            "n must be >= 0",
		`{"p":-1}`:                            "p must be >= 0",
		`{"u":-1}`:                            "u must be >= 0",
		`{"tagged":{"t":-1}}`:                 "tagged.t must be >= 0",
		`{"customer":"Ada Lovelace"}`:         "Customer must be at most 3 characters",
		`{"billing":{"zip":"1"}}`:             `billing.zip fails rule "len=5"`,
		`{"items":[{"sku":"a"},{"sku":""}]}`:  "items[1].sku is required",
		`{"itemPtrs":[{"sku":"a","qty":-1}]}`: "itemPtrs[0].qty must be >= 0",
		`{"byKey":{"k":{"sku":""}}}`:          "byKey.k.sku is required",
		`{"byKey":{"a.b]":{"sku":""}}}`:       `byKey["a.b]"].sku is required`,
		`{"email":"nope"}`:                    "email must be an email address",
	} {
		var in pathInput
		err := framework.DecodePayload(json.RawMessage(raw), &in)
		var ve *framework.ValidationError
		require.ErrorAs(t, err, &ve, raw)
		require.Len(t, ve.Fields, 1, "%s: %v", raw, ve.Fields)
		field, _, _ := strings.Cut(want, " ")
		require.Equal(t, field, ve.Fields[0].Field, raw)
		require.Equal(t, want, ve.Fields[0].Message, raw)
	}
	require.NoError(t, framework.DecodePayload(json.RawMessage(`{}`), &pathInput{}))
}

// A payload of an unnamed struct type has no type name heading the
// validator's path: its first field is not dropped for one.
func TestValidatePayloadOfAnUnnamedStructKeepsTheWholePath(t *testing.T) {
	t.Parallel()
	var in struct {
		Address pathAddress `json:"address"`
	}
	err := framework.DecodePayload(json.RawMessage(`{"address":{"zip":"1"}}`), &in)
	var ve *framework.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "address.zip", ve.Fields[0].Field)
}

// DecodeErrorPath names the failing value by its JSON path, with indexes,
// and gives up on what it cannot or will not walk.
func TestDecodeErrorPath(t *testing.T) {
	t.Parallel()
	type item struct {
		SKU string `json:"sku"`
	}
	type order struct {
		Items []item `json:"items"`
	}
	for _, tc := range []struct{ raw, want string }{
		{`{"items": [{"sku": "a"}, {"sku": 7}]}`, "items[1].sku"},
		{`{"items": [{"sku": "a", "qty": 1}]}`, "items[0].qty"},
		{`{"items": [{"sku": "a"}]}`, ""},                                            // decodes
		{`{"items": [{"sku": `, ""},                                                  // malformed
		{`[]`, ""},                                                                   // the value itself
		{`{"items": [` + strings.Repeat(`{"sku": "a"},`, 6000) + `{"sku": 1}]}`, ""}, // over 64 KiB
	} {
		require.Equal(t, tc.want, framework.DecodeErrorPath([]byte(tc.raw), &order{}), tc.raw)
	}
}
