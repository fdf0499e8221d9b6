package web

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// foldKey groups exactly the keys strings.EqualFold (and so encoding/json)
// takes for one another, including the non-ASCII folds (Kelvin sign, long s).
func TestFoldKey(t *testing.T) {
	t.Parallel()
	words := []string{"note", "Note", "NOTE", "kind", "\u212aind", "Kind", "sum", "\u017fum", "Sum", "σ", "ς", "Σ", "a", "b", "ü", "Ü"}
	for _, a := range words {
		for _, b := range words {
			require.Equal(t, strings.EqualFold(a, b), foldKey(a) == foldKey(b), "%q %q", a, b)
		}
	}
}

// Payloads without case-variant keys keep the canonical form they had
// (sorted keys, no white space), so stored fingerprints stay valid.
func TestCanonicalJSONWithoutCaseVariants(t *testing.T) {
	t.Parallel()
	got, err := canonicalJSON(json.RawMessage(`{ "b": [1, {"y": 2, "x": 1.50}], "a": "\u0041" }`))
	require.NoError(t, err)
	require.Equal(t, `{"a":"A","b":[1,{"x":1.50,"y":2}]}`, string(got))
	got, err = canonicalJSON(json.RawMessage(`{"outer": {"note": "a", "Note": "b"}}`))
	require.NoError(t, err)
	require.Equal(t, `{"outer":{"note":"a","Note":"b"}}`, string(got), "compacted in its own order")
}
