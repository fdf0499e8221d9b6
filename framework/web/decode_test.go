package web

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

func TestDepthWithin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		max  int
		want bool
	}{
		{`{}`, 1, true},
		{`{"a":{}}`, 1, false},
		{`{"a":[1,{"b":2}]}`, 3, true},
		{`{"a":[1,{"b":[]}]}`, 3, false},
		{`{"a":"[[[[{{{{"}`, 1, true},
		{`{"a":"\"[[[["}`, 1, true},
		{`{"a":"\\","b":[[]]}`, 2, false},
		{`{"a":"\\","b":[]}`, 2, true},
	} {
		require.Equal(t, tc.want, depthWithin([]byte(tc.in), tc.max), tc.in)
	}
}

func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []string{
		`{"type":"orders:write:place","payload":{"customer":"Ada"}}`,
		`{"type":"x","payload":[[[[]]]],"requestId":"k"}`,
		`{"type":5}`, `{"type":"x"} {}`, `[]`, `null`, ``, `{"type":"\u00e9\"["}`,
		`{"type":"x","extra":1}`, strings.Repeat("[", 100), `{"payload":` + strings.Repeat("[", 70),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req writeRequest
		err := decodeJSON(body, 8, &req)
		if err == nil {
			require.True(t, json.Valid(body), "accepted invalid JSON %q", body)
			require.True(t, depthWithin(body, 8))
			var m map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(body, &m), "accepted a non-object %q", body)
			return
		}
		var fe *framework.Error
		require.True(t, errors.As(err, &fe), "%T", err)
		require.Equal(t, framework.CodeBadRequest, fe.Code)
		require.NotEmpty(t, fe.Message)
	})
}
