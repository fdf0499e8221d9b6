package dispatcher_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// Once Run's context ends, the pass in flight finishes and no new pass
// starts, although a backlog is waiting. Before, the loop chose at random
// between the ended context and the next pass (Go's select picks any ready
// case), so a draining process ran one more pass every other time (up to
// PassTimeout each), in a row, and could overrun its drain timeout.
func TestNoPassStartsAfterRunsContextEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.write(t, "t1", 0, 40, 1)
	b.db.WaitVisible(t)
	for trial := range 12 {
		ctx, cancel := context.WithCancel(context.Background())
		var calls atomic.Int32
		c := dispatcher.Consumer{Name: fmt.Sprintf("test:drain-%d", trial), System: true, BatchSize: 1,
			Apply: func(context.Context, *framework.Tx, framework.Envelope) error {
				if calls.Add(1) == 1 {
					cancel() // shutdown begins during the first pass
				}
				return nil
			}}
		d, err := dispatcher.New(b.db.Pool, b.reg, []dispatcher.Consumer{c}, &dispatcher.Config{InstanceID: "drain", PollOnly: true})
		require.NoError(t, err)
		require.NoError(t, d.Run(ctx))
		cancel()
		require.Equal(t, int32(1), calls.Load(), "trial %d: passes ran after the context ended", trial)
	}
}
