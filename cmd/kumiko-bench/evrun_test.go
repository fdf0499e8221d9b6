package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An operation that fails after the slice's time ran out (it was in flight
// when the timer fired) still fails the run: a failed operation must never
// pass silently.
func TestEvRunReportsErrorsOfOperationsInFlightAtTheEnd(t *testing.T) {
	boom := errors.New("boom")
	ops, err := evRun(t.Context(), 2, 10*time.Millisecond, func(context.Context, int) error {
		time.Sleep(40 * time.Millisecond)
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, ops)
}
