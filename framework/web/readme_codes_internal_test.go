package web

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

// TestREADMEListsEveryErrorCode: the README's error table is the client's
// list of codes; every code an answer can carry is in it, with the status
// that goes with it.
func TestREADMEListsEveryErrorCode(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(b), "| code | status | when |")
	require.True(t, ok, "README.md has no error code table")
	table, _, _ = strings.Cut(table, "\n\n")
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| ([0-9]{3}) \\|")
	documented := map[string]int{}
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		status, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		documented[m[1]] = status
	}
	for _, code := range []framework.Code{
		framework.CodeValidation, framework.CodeBadRequest, framework.CodeUnauthorized,
		framework.CodeAccessDenied, framework.CodeNotFound, codeMethodNotAllowed,
		framework.CodeVersionConflict, framework.CodeConflict, framework.CodePayloadTooLarge,
		framework.CodeUnprocessable, framework.CodeIdempotencyKeyReused, framework.CodeInternal,
		framework.CodeUnavailable, framework.CodeIdempotencyUnavailable,
	} {
		status, ok := documented[string(code)]
		if !ok {
			t.Errorf("README.md's error table has no row for %s (HTTP %d)", code, statusOf(code))
			continue
		}
		require.Equal(t, statusOf(code), status, "README.md's status of %s", code)
	}
}
