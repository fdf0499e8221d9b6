package dispatcher_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestVerbOnTheWrongRowNamesTheRowsThatExist: a verb or status without an
// instance on a per-instance consumer (the README: "without it the verbs
// act on the shared row") said "consumer test:local not found", though
// `consumer list` shows it; it names the consumer's instances instead. An
// instance given for a shared consumer says that it is shared.
func TestVerbOnTheWrongRowNamesTheRowsThatExist(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
		recorder(b, "shared", nil)
	})
	ctx := context.Background()
	newDispatcher(t, b, &dispatcher.Config{InstanceID: "api-1"})
	newDispatcher(t, b, &dispatcher.Config{InstanceID: "api-2"})

	err := dispatcher.Disable(ctx, b.db.Pool, "test:local", "")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	require.EqualError(t, err, "consumer test:local has no shared row: it is per-instance, name one of its instances: api-1, api-2")
	_, err = dispatcher.Status(ctx, b.db.Pool, "test:local", "")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	require.EqualError(t, err, "consumer test:local has no shared row: it is per-instance, name one of its instances: api-1, api-2")

	err = dispatcher.Disable(ctx, b.db.Pool, "test:local", "api-3")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	require.EqualError(t, err, "consumer test:local (instance api-3) not found; its instances: api-1, api-2")

	_, err = dispatcher.Skip(ctx, b.db.Pool, "test:shared", "api-1")
	require.ErrorIs(t, err, dispatcher.ErrConsumerNotFound)
	require.EqualError(t, err, "consumer test:shared (instance api-1) not found: test:shared is shared, leave the instance out")

	// A name nobody has stays a plain "not found".
	err = dispatcher.Restart(ctx, b.db.Pool, "test:nope", "")
	require.EqualError(t, err, "consumer test:nope not found")
}
