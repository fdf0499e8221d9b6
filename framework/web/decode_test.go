package web

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

func TestScanJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		max     int
		shallow bool
		nul     bool
	}{
		{`{}`, 1, true, false},
		{`{"a":{}}`, 1, false, false},
		{`{"a":[1,{"b":2}]}`, 3, true, false},
		{`{"a":[1,{"b":[]}]}`, 3, false, false},
		{`{"a":"[[[[{{{{"}`, 1, true, false},
		{`{"a":"\"[[[["}`, 1, true, false},
		{`{"a":"\\","b":[[]]}`, 2, false, false},
		{`{"a":"\\","b":[]}`, 2, true, false},
		{`{"a":"x\u0000y"}`, 1, true, true},
		{`{"a\u0000":1}`, 1, true, true},
		{`{"a":"\\u0000"}`, 1, true, false}, // an escaped backslash, then the text u0000
		{`{"a":"\u00001"}`, 1, true, true},
		{`{"a":"\u0001\u000"}`, 1, true, false},
		{`{"a":"\u`, 1, true, false},
	} {
		shallow, nul := scanJSON([]byte(tc.in), tc.max)
		require.Equal(t, tc.shallow, shallow, tc.in)
		require.Equal(t, tc.nul, nul, tc.in)
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
		err := DecodeJSON(body, 8, &req)
		if err == nil {
			require.True(t, json.Valid(body), "accepted invalid JSON %q", body)
			shallow, nul := scanJSON(body, 8)
			require.True(t, shallow)
			require.False(t, nul, "accepted a NUL in %q", body)
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
