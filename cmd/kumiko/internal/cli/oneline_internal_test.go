package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// An error text is data (it may quote an event's payload or a remote
// service's reply): printed for an operator it must not reach the terminal
// as control sequences that clear the screen, move the cursor over the
// dead consumers' lines, retitle the window or write the clipboard.
func TestOneLineEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	evil := "boom \x1b[2J\x1b[H\x1b]52;c;ZWNobyBwd25lZA==\x07 bell\x07 nul\x00 del\x7f csi\u009b done"
	for name, f := range map[string]func(string, int) string{"consumer": consumerOneLine, "jobs": jobsOneLine} {
		got := f(evil, 500)
		require.NotContains(t, got, "\x1b", name)
		require.NotContains(t, got, "\x07", name)
		require.NotContains(t, got, "\x00", name)
		require.NotContains(t, got, "\x7f", name)
		require.NotContains(t, got, "\u009b", name)
		require.Contains(t, got, `\x1b[2J`, "%s: the sequence stays visible, escaped", name)
		require.True(t, strings.HasPrefix(got, "boom "), name)
	}
	// Whitespace still folds to single spaces.
	require.Equal(t, "a b c", consumerOneLine("a\n\tb  \r\nc", 60))

	var buf bytes.Buffer
	fp := int64(7)
	require.NoError(t, writeConsumerTable(&buf, []dispatcher.ConsumerStatus{{
		Name: "orders:order-totals", InstanceID: dispatcher.SharedInstance, Status: "dead",
		Cursor: eventstore.Cursor{}, FailedPosition: &fp, LastError: evil, HeartbeatAge: time.Second,
	}}))
	require.NotContains(t, buf.String(), "\x1b")
}
