package framework_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

// A handler that wraps a validation or concurrency error in its own *Error
// chose the code and message the client sees; ToError answered the inner
// error instead (a 400 with the field list of an internal event payload
// for a handler's 500, the generic version_conflict for its conflict).
func TestToErrorKeepsTheHandlersError(t *testing.T) {
	t.Parallel()
	ve := &framework.ValidationError{Fields: []framework.FieldError{{Field: "secret", Rule: "required", Message: "secret is required"}}}
	mine := &framework.Error{Code: framework.CodeInternal, Message: "the invoice could not be recorded", Err: ve}
	require.Same(t, mine, framework.ToError(fmt.Errorf("render: %w", mine)))

	ce := framework.NewConcurrencyError(framework.Stream{Type: "order", ID: "1"}, 1, 2)
	mine = &framework.Error{Code: framework.CodeConflict, Message: "the order changed meanwhile: reload it", Err: ce}
	require.Same(t, mine, framework.ToError(mine))
	got := framework.ToError(&framework.BatchError{Index: 1, Err: mine})
	require.Equal(t, framework.CodeConflict, got.Code)
	require.Equal(t, "command 1: the order changed meanwhile: reload it", got.Message)

	// Unwrapped, they keep their own envelopes.
	require.Equal(t, framework.CodeValidation, framework.ToError(fmt.Errorf("x: %w", ve)).Code)
	require.Equal(t, framework.CodeVersionConflict, framework.ToError(ce).Code)
}
