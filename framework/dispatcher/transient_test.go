package dispatcher_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

var errUnreachable = errors.New("dependency unreachable")

// TestTransientFailuresNeverKillTheConsumer: errors the consumer classifies
// as transient are retried with backoff but count no attempt, so far more
// failures than MaxAttempts neither kill the consumer nor dead-letter the
// event (even with SkipApplyErrors); the cursor waits, and once the error
// clears every event is delivered. A non-transient error still counts.
func TestTransientFailuresNeverKillTheConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var down atomic.Bool
	var permanent atomic.Bool
	down.Store(true)
	c := dispatcher.Consumer{
		Name:            "test:transient",
		System:          true,
		SkipApplyErrors: true,
		MaxAttempts:     2,
		Transient:       func(err error) bool { return errors.Is(err, errUnreachable) },
		Apply: func(ctx context.Context, tx *framework.Tx, env framework.Envelope) error {
			if permanent.Load() {
				return errors.New("bad event")
			}
			if down.Load() {
				return errUnreachable
			}
			_, err := tx.Exec(ctx, `INSERT INTO seen VALUES ($1, 'transient', $2, 0, '', '')`, env.TenantID, env.Position)
			return err
		},
	}
	d, err := dispatcher.New(b.db.Pool, b.reg, []dispatcher.Consumer{c}, &dispatcher.Config{
		InstanceID: "transient-test", RetryBaseDelay: time.Millisecond, RetryMaxDelay: 5 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, d.Register(context.Background()))
	b.write(t, "t1", 0, 5, 5)

	failures := 0
	deadline := time.Now().Add(30 * time.Second)
	for failures < 8 {
		require.True(t, time.Now().Before(deadline))
		n, err := d.RunOnce(context.Background(), "test:transient")
		require.NoError(t, err)
		require.Zero(t, n)
		if st := state(t, b, "test:transient", dispatcher.SharedInstance); st.lastErr != nil {
			require.Equal(t, "idle", st.status)
			require.Equal(t, 0, st.attempts, "a transient failure counts no attempt")
			require.Contains(t, *st.lastErr, "dependency unreachable")
			failures++
		}
		time.Sleep(6 * time.Millisecond)
	}
	require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters`))

	down.Store(false)
	drain(t, d, "test:transient", 5)
	require.Equal(t, 5, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'transient'`))
	st := state(t, b, "test:transient", dispatcher.SharedInstance)
	require.Equal(t, "idle", st.status)
	require.Nil(t, st.lastErr)

	// A non-transient failure is dead-lettered as before (SkipApplyErrors).
	permanent.Store(true)
	b.write(t, "t1", 5, 1, 1)
	deadline = time.Now().Add(30 * time.Second)
	for count(t, b, `SELECT count(*) FROM event_dead_letters`) == 0 {
		require.True(t, time.Now().Before(deadline))
		_, err := d.RunOnce(context.Background(), "test:transient")
		require.NoError(t, err)
		time.Sleep(2 * time.Millisecond)
	}
}
