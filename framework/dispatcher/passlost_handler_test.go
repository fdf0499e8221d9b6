package dispatcher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestHandlerErrorThatLooksLikeANetworkErrorIsTheEventsFailure: a pass is
// lost only when its own connection is (or the database picks its
// transaction as a victim). A handler that fails on its own, with an error
// that merely resembles a lost connection (a truncated blob in the payload
// decoded with json.Decoder: io.ErrUnexpectedEOF; a dial to a service that
// is down: a net.Error) while the pass's connection is fine, failed its
// event: it counts attempts and is dead-lettered by SkipApplyErrors, as
// before passes could be lost. Taken for a lost pass, such a poison event
// held its consumer for ever, retried without end, and SkipApplyErrors
// could never move past it.
func TestHandlerErrorThatLooksLikeANetworkErrorIsTheEventsFailure(t *testing.T) {
	t.Parallel()
	handlerErrs := map[string]func() error{
		"eof": func() error {
			var v map[string]any
			return fmt.Errorf("decode attachment: %w", json.NewDecoder(strings.NewReader(`{"a":`)).Decode(&v))
		},
		"dial": func() error {
			// A port nobody listens on: connection refused, a *net.OpError.
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return err
			}
			addr := l.Addr().String()
			_ = l.Close()
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				_ = c.Close()
				return fmt.Errorf("dial %s: unexpectedly connected", addr)
			}
			return fmt.Errorf("notify service: %w", err)
		},
	}
	b := setup(t, func(b *bundle) {
		for name, fail := range handlerErrs {
			strict := framework.MultiStreamProjection(b.f, name+"-strict", &framework.ProjectionOptions{MaxAttempts: 1})
			framework.On(strict, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
				return fail()
			})
			skip := framework.MultiStreamProjection(b.f, name+"-skip", &framework.ProjectionOptions{SkipApplyErrors: true})
			framework.On(skip, b.noted, func(ctx context.Context, tx *framework.Tx, e framework.Event[noted]) error {
				return fail()
			})
		}
	})
	d := newDispatcher(t, b, &dispatcher.Config{RetryBaseDelay: time.Millisecond, RetryMaxDelay: time.Millisecond})
	b.write(t, "t1", 0, 1, 1)
	b.db.WaitVisible(t)

	for name := range handlerErrs {
		strict := "test:" + name + "-strict"
		_, err := d.RunOnce(context.Background(), strict)
		require.NoError(t, err, strict)
		st := state(t, b, strict, dispatcher.SharedInstance)
		require.Equal(t, "dead", st.status, "%s: %+v", strict, st)
		require.Equal(t, 1, st.attempts, strict)
		require.NotNil(t, st.lastErr, strict)
		require.False(t, strings.HasPrefix(*st.lastErr, dispatcher.PassLost), "%s: %q", strict, *st.lastErr)

		skip := "test:" + name + "-skip"
		_, err = d.RunOnce(context.Background(), skip)
		require.NoError(t, err, skip)
		require.Equal(t, 1, count(t, b, `SELECT count(*) FROM event_dead_letters WHERE consumer = $1`, skip), skip)
	}
}
