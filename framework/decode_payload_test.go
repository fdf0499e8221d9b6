package framework_test

import (
	"encoding/json"
	"net/netip"
	"testing"
	"time"

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
