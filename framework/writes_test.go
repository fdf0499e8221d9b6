package framework_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
)

// touchInput is the payload of writes-test:write:touch: append one event to
// the stream pair/<stream> at any version.
type touchInput struct {
	Stream string `json:"stream" validate:"required"`
}

// registerTouch registers writes-test:write:touch.
func registerTouch(r *framework.Registry) {
	f := r.Feature("writes-test")
	ev := framework.DefineEvent[noted](f, "touched", nil)
	framework.Write(f, "touch", func(_ context.Context, tx *framework.Tx, in touchInput) (struct{}, error) {
		return struct{}{}, tx.Append(framework.Stream{Type: "pair", ID: in.Stream}, framework.AnyVersion, ev.With(noted{Text: in.Stream}))
	}, nil)
}

// Two batches that touch the same streams in opposite command order both
// commit: a batch locks its streams in sorted order like one command's
// appends do, so concurrent batches never deadlock (a deadlock would be
// rolled back by Postgres and answered 409 to one of them).
func TestBatchesInOppositeOrderNeverDeadlock(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) { registerTouch(r) })
	const rounds = 30
	orders := [][]string{{"x", "y"}, {"y", "x"}}
	errs := make(chan error, rounds*len(orders))
	var wg sync.WaitGroup
	for range rounds {
		for _, order := range orders {
			wg.Go(func() {
				cmds := make([]framework.Command, 0, len(order))
				for _, s := range order {
					cmds = append(cmds, command(t, "writes-test:write:touch", touchInput{Stream: s}))
				}
				_, err := b.rt.Write(t.Context(), callAs("t1", "alice"), cmds)
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			failed++
			t.Log(err)
		}
	}
	require.Zero(t, failed, "batches failed")
	for _, s := range []string{"x", "y"} {
		require.Equal(t, int64(2*rounds), b.count(t, `SELECT count(*) FROM events WHERE stream_id = $1`, s), fmt.Sprint("events of ", s))
	}
}

// A batch's appends are written together with its COMMIT, in stream order,
// yet a version conflict still names the command that appended: whether it
// comes first, in the middle or last, and whatever the order of the
// streams. Nothing of the batch persists.
func TestBatchConflictNamesTheAppendingCommand(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		registerTouch(r)
		registerNote(r, nil)
	})
	call := callAs("t1", "alice")
	id := b.place(t, "t1", "ada")
	stale := command(t, "tx-test:write:note", noteInput{OrderID: id, ExpectedVersion: 7, Customer: "bob"})
	touch := func(s string) framework.Command { return command(t, "writes-test:write:touch", touchInput{Stream: s}) }
	for name, tc := range map[string]struct {
		cmds  []framework.Command
		index int
	}{
		"first":  {[]framework.Command{stale, touch("a"), touch("b")}, 0},
		"middle": {[]framework.Command{touch("b"), stale, touch("a")}, 1},
		"last":   {[]framework.Command{touch("a"), touch("b"), stale}, 2},
	} {
		_, err := b.rt.Write(t.Context(), call, tc.cmds)
		var ce *framework.ConcurrencyError
		require.ErrorAs(t, err, &ce, name)
		var be *framework.BatchError
		require.ErrorAs(t, err, &be, name)
		require.Equal(t, tc.index, be.Index, name)
		require.Equal(t, framework.CodeVersionConflict, framework.ToError(err).Code, name)
	}
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM events`))
	require.Equal(t, "ada", func() string {
		var c string
		require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT customer FROM orders`).Scan(&c))
		return c
	}())
}

// A stream id too large for the log's index (a client's value a feature
// takes as its aggregate id, without a max tag) is the client's doing: a
// 400 validation_error, not a 500, and nothing of the write persists.
func TestStreamIDTooLargeForTheIndexIsAValidationError(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) { registerTouch(r) })
	// Random, so that Postgres cannot compress it under the index's limit.
	raw := make([]byte, 3000)
	_, _ = rand.Read(raw)
	_, err := b.write(t, callAs("t1", "alice"), "writes-test:write:touch", touchInput{Stream: hex.EncodeToString(raw)})
	e := framework.ToError(err)
	require.Equal(t, framework.CodeValidation, e.Code, "%v", err)
	require.Contains(t, e.Message, "too large")
	b.requireNothingPersisted(t)
}
