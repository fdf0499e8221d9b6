package entrypoint_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/retention"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestSplitDeploymentRegistersRunInAPIProjection: in a deployment of api
// and worker processes, a shared projection with runIn api runs in no
// process (only all-in-one ones run it, ARCHITECTURE §7), and no process
// registered its state row. The prune, which counts the shared consumers
// its binary declares, held back its event types for good, as "not
// registered yet", and there was no row to disable or skip: nothing but a
// code change let the prune go on. Now every api and worker process
// registers the row (at the start of the log, where an all-in-one process
// would) without running it: the prune still keeps the events the
// projection has not delivered, and names an ordinary row that an
// operator can disable to let it go on (or an all-in-one process catches
// up from).
func TestSplitDeploymentRegistersRunInAPIProjection(t *testing.T) {
	t.Parallel()
	var pinged framework.EventType[struct{}]
	register := func(r *framework.Registry) {
		f := r.Feature("split")
		pinged = framework.DefineEvent[struct{}](f, "pinged", nil)
		ponged := framework.DefineEvent[struct{}](f, "ponged", nil)
		api := framework.MultiStreamProjection(f, "api-side", &framework.ProjectionOptions{RunIn: framework.RunInAPI, Partitions: 2})
		framework.On(api, pinged, func(context.Context, *framework.Tx, framework.Event[struct{}]) error { return nil })
		worker := framework.MultiStreamProjection(f, "worker-side", nil)
		framework.On(worker, ponged, func(context.Context, *framework.Tx, framework.Event[struct{}]) error { return nil })
	}
	db := kumikotest.NewDB(t)
	rds := jobstest.StartRedis(t)
	var apps []*served
	for _, mode := range []string{"api", "worker"} {
		cfg := newConfig(t, map[string]string{"APP_MODE": mode, "DATABASE_URL": db.URL, "REDIS_URL": rds.URL})
		s := serve(t, entrypoint.Options{Config: cfg, Register: register, InstanceID: "split-" + mode})
		waitServedReady(t, s)
		apps = append(apps, s)
	}
	require.Contains(t, stateRows(t, db), "split:api-side@0/__shared__")
	require.Contains(t, stateRows(t, db), "split:api-side@1/__shared__")

	app := apps[1].app // pinged is of the last registry built
	for i := range 3 {
		_, err := app.Runtime().InTx(context.Background(), "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "p", ID: string(rune('a' + i))}, framework.AnyVersion, pinged.With(struct{}{}))
		})
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(context.Background(), `UPDATE events SET created_at = now() - interval '40 days'`)
	require.NoError(t, err)

	// The api process's live stream passes them.
	require.Eventually(t, func() bool {
		var behind bool
		err := db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM events e, event_consumers c
  WHERE c.name = $1 AND (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position))`, sse.ConsumerName).Scan(&behind)
		return err == nil && !behind
	}, wait, 10*time.Millisecond)

	opts := &retention.Options{OlderThanDays: 30, Types: []string{"split:event:pinged"}}
	_, err = retention.Prune(context.Background(), db.Pool, app.Registry(), opts)
	var lag *retention.LagError
	require.ErrorAs(t, err, &lag)
	var lagging []string
	for _, c := range lag.Consumers {
		require.NotEqual(t, retention.StatusUnregistered, c.Status, "%s", err)
		lagging = append(lagging, c.Name)
	}
	require.Equal(t, []string{"split:api-side@0", "split:api-side@1"}, lagging)
	var left int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM events`).Scan(&left))
	require.Equal(t, 3, left, "a refused prune deleted events")

	// The operator parks it: the prune goes on.
	for _, name := range []string{"split:api-side@0", "split:api-side@1"} {
		require.NoError(t, dispatcher.Disable(context.Background(), db.Pool, name, ""))
	}
	res, err := retention.Prune(context.Background(), db.Pool, app.Registry(), opts)
	require.NoError(t, err)
	require.Equal(t, int64(3), res.Total)
	for _, s := range apps {
		require.NoError(t, s.stop(t))
	}
}
