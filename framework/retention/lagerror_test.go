package retention_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/rebuild"
	"github.com/kumiko-go/kumiko/framework/retention"
)

// TestLagErrorAdvisesAbandonForARebuildsRow: a lagging NAME#rebuild row is
// a projection rebuild's temporary consumer. Skipping or rewinding it under
// a running rebuild would drop or repeat events in the new table, and a
// killed rebuild's leftover is removed with --abandon: the refusal says so
// instead of advising consumer skip for it.
func TestLagErrorAdvisesAbandonForARebuildsRow(t *testing.T) {
	t.Parallel()
	err := &retention.LagError{Consumers: []retention.LaggingConsumer{
		{Name: rebuild.ConsumerName("orders:order-totals"), InstanceID: "__shared__", Status: "idle", Unseen: 3},
		{Name: "users:send-welcome-email", InstanceID: "__shared__", Status: "dead", Unseen: 1},
	}}
	msg := err.Error()
	require.Contains(t, msg, "orders:order-totals#rebuild is a projection rebuild's: let it finish, or remove what a killed one left with `kumiko projection rebuild orders:order-totals --abandon`")
	require.Contains(t, msg, "`kumiko consumer skip NAME [--instance ID]`")

	only := (&retention.LagError{Consumers: err.Consumers[:1]}).Error()
	require.NotContains(t, only, "consumer skip", "no plain consumer lags")
}
