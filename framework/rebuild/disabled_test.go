package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/rebuild"
)

// TestRebuildStopsWhenItsConsumerIsDisabled: an operator who disables the
// temporary consumer (as a prune's refusal suggests for every lagging
// consumer) parks it; the rebuild can never reach the end of the log. It
// stops with ErrDisabled and cleans up, rather than polling the disabled
// row forever.
func TestRebuildStopsWhenItsConsumerIsDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.count(t, "t1", "a", 0, 40)
	b.db.WaitVisible(t)
	oid := b.oid(t, "tally")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	disabled := false
	_, err := rebuild.Rebuild(ctx, b.db.Pool, b.reg, "test:tally", &rebuild.Config{
		BatchSize: 5,
		Progress: func(p rebuild.Progress) {
			if p.Events >= 10 && !disabled {
				disabled = true
				require.NoError(t, dispatcher.Disable(ctx, b.db.Pool, rebuild.ConsumerName("test:tally"), ""))
			}
		},
	})
	require.ErrorIs(t, err, rebuild.ErrDisabled)
	require.NoError(t, ctx.Err(), "the rebuild must stop on its own")
	require.Equal(t, oid, b.oid(t, "tally"))
	require.Zero(t, b.int(t, `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'kumiko_rebuild%'`))
	require.Zero(t, b.int(t, `SELECT count(*) FROM event_consumers WHERE name LIKE '%#rebuild'`))
}
