package framework_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
)

// A hook that panics after the commit (AfterCommit, OnCommit) cannot undo
// the write: Write still reports success, and the other hooks still run.
// A panic that escaped Write turned a committed write into a 500 (which a
// client retries, writing twice) and skipped the later hooks.
func TestPanicAfterCommitDoesNotFailTheWrite(t *testing.T) {
	t.Parallel()
	var ran []string
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		framework.Write(r.Feature("tx-test"), "after", func(ctx context.Context, tx *framework.Tx, in struct {
			Name string `json:"name"`
		}) (string, error) {
			return in.Name, nil
		}, &framework.WriteOptions[struct {
			Name string `json:"name"`
		}, string]{
			AfterCommit: func(_ context.Context, in struct {
				Name string `json:"name"`
			}, _ string) {
				ran = append(ran, "after:"+in.Name)
				if in.Name == "boom" {
					panic("boom")
				}
			},
		})
	})
	b.rt.OnCommit(func(int) { ran = append(ran, "oncommit:1"); panic("oncommit") })
	b.rt.OnCommit(func(int) { ran = append(ran, "oncommit:2") })

	var res []any
	var err error
	require.NotPanics(t, func() {
		res, err = b.rt.Write(t.Context(), callAs("t1", "alice"), []framework.Command{
			command(t, "tx-test:write:after", map[string]string{"name": "boom"}),
			command(t, "orders:write:place", orders.PlaceInput{Customer: "ada", AmountCents: 1}),
			command(t, "tx-test:write:after", map[string]string{"name": "ok"}),
		})
	})

	require.NoError(t, err)
	require.Len(t, res, 3)
	require.Equal(t, []string{"oncommit:1", "oncommit:2", "after:boom", "after:ok"}, ran)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM orders`))
}
