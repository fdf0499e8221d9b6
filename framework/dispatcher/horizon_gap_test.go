package dispatcher_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// A pass that delivers nothing while an event after its cursor was
// committed before it began reports that event as waiting above the
// horizon, also when the transaction holding the horizon back ends during
// the pass. Before, the batch and the check for waiting events were two
// statements with two snapshots: a horizon that moved between them made
// the batch see the event above the horizon and the check see it below,
// so the pass reported nothing waiting, and with a long poll interval the
// event waited for the next poll (48 s and more) although it was visible
// (TestListenDeliversWithoutPolling timed out so once under load).
func TestPassReportsEventsTheHorizonHid(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	d := newDispatcher(t, b, &dispatcher.Config{PollInterval: time.Minute})
	ctx := context.Background()
	const rounds = 150
	for i := range rounds {
		holder, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = holder.Exec(ctx, `SELECT pg_current_xact_id()`)
		require.NoError(t, err)
		b.write(t, "t1", i, 1, 1) // above the horizon until holder ends

		type outcome struct {
			passes int
			err    error
		}
		done := make(chan outcome, 1)
		go func() {
			passes := 0
			for {
				passes++
				n, pending, err := d.PassOutcome(ctx, "test:a")
				switch {
				case err != nil:
					done <- outcome{passes, err}
					return
				case n > 0:
					done <- outcome{passes, nil}
					return
				case !pending:
					done <- outcome{passes, errLostEvent}
					return
				}
			}
		}()
		// End the holder while passes run back to back, at a point that
		// varies from round to round.
		time.Sleep(time.Duration(rand.Int64N(int64(3 * time.Millisecond))))
		require.NoError(t, holder.Rollback(ctx))
		o := <-done
		require.NoError(t, o.err, "round %d, pass %d", i, o.passes)
	}
	require.Equal(t, rounds, count(t, b, `SELECT count(*) FROM seen`))
}

var errLostEvent = errors.New("a pass delivered nothing and saw nothing waiting above the horizon, with an event committed before it")
