package entrypoint_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/entrypoint"
	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs/jobstest"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// TestJobRunsLeaveConnectionsToTheProcess: the job lanes of a process run
// KUMIKO_JOBS_CONCURRENCY (ten) at once each, and a run's transaction holds a connection of the pool
// the dispatcher, requests and health checks use too; so job runs may hold
// all but two of DATABASE_POOL_MAX at once (jobs.Config.MaxTransactions),
// in every mode that runs lanes.
func TestJobRunsLeaveConnectionsToTheProcess(t *testing.T) {
	t.Parallel()
	rds := jobstest.StartRedis(t)
	for mode, poolMax := range map[string]string{"worker": "5", "all-in-one": "10"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := kumikotest.NewDB(t)
			cfg := newConfig(t, map[string]string{"APP_MODE": mode, "DATABASE_URL": db.URL, "REDIS_URL": rds.URL,
				"DATABASE_POOL_MAX": poolMax})
			var logs proctest.Buffer
			s := serve(t, entrypoint.Options{Config: cfg, Register: func(r *framework.Registry) { orders.Register(r) },
				InstanceID: "jobtx-" + mode, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			waitServedReady(t, s)
			want := map[string]string{"5": "max_transactions=3", "10": "max_transactions=8"}[poolMax]
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), "job lane started") }, wait, 10*time.Millisecond)
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "job lane started") {
					require.Contains(t, line, want, "%s", line)
				}
			}
			require.NoError(t, s.stop(t))
		})
	}
}
