package dispatcher_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// A handler's error is stored as text (last_error, the dead letter's
// error), and Postgres refuses text that is not valid UTF-8 or holds a NUL
// byte. An error cut at 2000 bytes in the middle of a character, or one that
// quotes raw bytes, must still be recorded: otherwise the statement that
// records the failure fails, the pass errors before counting an attempt,
// and the consumer retries the event forever, never backing off, never
// turning dead and never dead-lettering it.
func TestFailureWithUnstorableErrorTextIsRecorded(t *testing.T) {
	t.Parallel()
	// Two-byte characters after prefixes of both parities: in one of the
	// two errors the 2000th byte is the first byte of an é.
	multibyte := map[string]string{"strict-a": strings.Repeat("é", 1500), "strict-b": "x" + strings.Repeat("é", 1500)}
	rawBytes := "bad payload \xff\xfe with a \x00 NUL"
	b := setup(t, func(b *bundle) {
		for name, msg := range multibyte {
			strict := framework.MultiStreamProjection(b.f, name, &framework.ProjectionOptions{MaxAttempts: 1})
			framework.On(strict, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
				if e.Payload.N == 1 {
					return errors.New(msg)
				}
				return nil
			})
		}
		lenient := framework.MultiStreamProjection(b.f, "lenient", &framework.ProjectionOptions{SkipApplyErrors: true})
		framework.On(lenient, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
			if e.Payload.N == 1 {
				return errors.New(rawBytes)
			}
			return nil
		})
	})
	d := newDispatcher(t, b, nil)
	b.write(t, "t1", 0, 3, 1)
	b.db.WaitVisible(t)

	for name := range multibyte {
		n, err := d.RunOnce(context.Background(), "test:"+name)
		require.NoError(t, err, "%s: recording the failure failed", name)
		require.Equal(t, 1, n)
		st := state(t, b, "test:"+name, dispatcher.SharedInstance)
		require.Equal(t, "dead", st.status, name)
		require.Equal(t, 1, st.attempts, name)
		require.NotNil(t, st.lastErr)
		require.True(t, utf8.ValidString(*st.lastErr))
		require.Contains(t, *st.lastErr, strings.Repeat("é", 900), "last_error keeps the error's text")
	}

	drain(t, d, "test:lenient", 2)
	var stored string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT error FROM event_dead_letters WHERE consumer = 'test:lenient'`).Scan(&stored))
	require.Contains(t, stored, "bad payload")
	require.Contains(t, stored, "NUL")
	require.Equal(t, "idle", state(t, b, "test:lenient", dispatcher.SharedInstance).status)
}
