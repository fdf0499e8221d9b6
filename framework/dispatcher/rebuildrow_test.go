package dispatcher_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestVerbsRefuseARebuildsRow: a NAME#rebuild row is a projection
// rebuild's temporary consumer. Skipping or rewinding it under a running
// rebuild drops or repeats events in the table being built, and restarting
// or enabling it runs nothing (no dispatcher runs it but the rebuild's
// own): those verbs are refused with the way out. Disable stays: it stops
// a running rebuild.
func TestVerbsRefuseARebuildsRow(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	ctx := context.Background()
	const name = "test:a#rebuild"
	want := "consumer test:a#rebuild is a projection rebuild's temporary consumer: %s would drop or repeat events in the table it builds, or run nothing; let the rebuild finish, disable the row to stop it, or remove a killed rebuild's leftover with `kumiko projection rebuild test:a --abandon`"
	for verb, run := range map[string]func() error{
		"restart": func() error { return dispatcher.Restart(ctx, b.db.Pool, name, "") },
		"enable":  func() error { return dispatcher.Enable(ctx, b.db.Pool, name, "") },
		"skip": func() error {
			_, err := dispatcher.Skip(ctx, b.db.Pool, name, "")
			return err
		},
		"rewind": func() error {
			_, err := dispatcher.Rewind(ctx, b.db.Pool, name, "", dispatcher.RewindTo{})
			return err
		},
	} {
		err := run()
		require.ErrorIs(t, err, dispatcher.ErrRebuildConsumer, verb)
		require.EqualError(t, err, fmt.Sprintf(want, verb), verb)
	}
	// Disable is not refused for the name (here: no such row).
	require.ErrorIs(t, dispatcher.Disable(ctx, b.db.Pool, name, ""), dispatcher.ErrConsumerNotFound)
}
