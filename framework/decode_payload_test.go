package framework_test

import (
	"encoding/json"
	"testing"

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
