package dispatcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// TestNewerEventVersionWaitsForTheNewerCode: an event stored at a schema
// version above the one this process declares (a newer release wrote it;
// this one still runs, or was rolled back to) is not this code's to
// handle, and not a poison event either: the newer code handles it. So it
// is retried without counting attempts: a projection does not turn dead
// over it, and a SkipApplyErrors projection does not dead-letter it and
// move past (which would lose it for the newer code as well).
func TestNewerEventVersionWaitsForTheNewerCode(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "strict", &framework.ProjectionOptions{MaxAttempts: 2})
		recorder(b, "lenient", &framework.ProjectionOptions{SkipApplyErrors: true})
	})
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, RetryMaxDelay: 2 * time.Millisecond})
	b.write(t, "t1", 0, 2, 1)
	_, err := eventstore.Append(context.Background(), b.db.Pool, eventstore.StreamRef{TenantID: "t1", Type: "s", ID: "new"}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: b.noted.Name(), TypeVersion: 2, Payload: []byte(`{"count":9}`)}})
	require.NoError(t, err)
	b.write(t, "t1", 2, 1, 1)
	b.db.WaitVisible(t)

	for _, name := range []string{"test:strict", "test:lenient"} {
		for range 20 {
			_, err := d.RunOnce(context.Background(), name)
			require.NoError(t, err)
			time.Sleep(3 * time.Millisecond)
		}
		st := state(t, b, name, dispatcher.SharedInstance)
		require.NotEqual(t, "dead", st.status, name)
		require.NotNil(t, st.lastErr, name)
		require.Contains(t, *st.lastErr, "stored at version 2", name)
		require.Zero(t, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = $1`, name), name)
	}
	require.Equal(t, 2, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'lenient'`), "the lenient one stays at the newer event")
	require.Equal(t, 2, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'strict'`))
}
