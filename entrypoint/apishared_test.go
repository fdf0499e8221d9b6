package entrypoint_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// TestAPIRunsNoSharedConsumers: ARCHITECTURE §7's table, "api: shared
// consumers no". An api process ran the shared projections declared with
// runIn api or both; it now runs only per-instance ones (the SSE hub
// here), while a worker runs the shared runIn worker/both ones and an
// all-in-one process all of them. The api-side projection, which neither
// split mode runs, still gets its state row from both (see
// TestSplitDeploymentRegistersRunInAPIProjection).
func TestAPIRunsNoSharedConsumers(t *testing.T) {
	t.Parallel()
	register := func(r *framework.Registry) {
		f := r.Feature("sides")
		ev := framework.DefineEvent[struct{}](f, "pinged", nil)
		for name, in := range map[string]framework.RunIn{"api-side": framework.RunInAPI, "both-sides": framework.RunInBoth, "worker-side": framework.RunInWorker} {
			p := framework.MultiStreamProjection(f, name, &framework.ProjectionOptions{RunIn: in})
			framework.On(p, ev, func(context.Context, *framework.Tx, framework.Event[struct{}]) error { return nil })
		}
	}
	rds := jobstest.StartRedis(t)
	for mode, want := range map[string][]string{
		"api":        {sse.ConsumerName},
		"worker":     {"sides:both-sides", "sides:worker-side"},
		"all-in-one": {"sides:api-side", "sides:both-sides", "sides:worker-side", sse.ConsumerName},
	} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := kumikotest.NewDB(t)
			cfg := newConfig(t, map[string]string{"APP_MODE": mode, "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
			var logs proctest.Buffer
			s := serve(t, entrypoint.Options{Config: cfg, Register: register, InstanceID: "sides-" + mode,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			waitServedReady(t, s)
			runs := s.app.Dispatcher().Consumers()
			slices.Sort(runs)
			require.Equal(t, want, runs)
			rows := map[string][]string{
				"api":        {"sides:api-side/__shared__", sse.ConsumerName + "/sides-api"},
				"worker":     {"sides:api-side/__shared__", "sides:both-sides/__shared__", "sides:worker-side/__shared__"},
				"all-in-one": {"sides:api-side/__shared__", "sides:both-sides/__shared__", "sides:worker-side/__shared__", sse.ConsumerName + "/sides-all-in-one"},
			}[mode]
			require.Equal(t, rows, stateRows(t, db))
			require.NoError(t, s.stop(t))
			// The api-side projection runs in neither split mode: both say so.
			warned := strings.Contains(logs.String(), "a shared projection with runIn api runs only in all-in-one processes")
			require.Equal(t, mode != "all-in-one", warned, "%s", logs.String())
		})
	}
}
