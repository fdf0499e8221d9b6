package features_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/features"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestNightlyReportSpecFromConfig: the sample nightly report runs on
// KUMIKO_SAMPLE_CRON when it is set, else every minute with KUMIKO_DEV,
// else at 02:00 UTC, read through the configuration.
func TestNightlyReportSpecFromConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "0 2 * * *"},
		{map[string]string{"KUMIKO_DEV": "true"}, "*/1 * * * *"},
		{map[string]string{"KUMIKO_SAMPLE_CRON": "@every 2s"}, "@every 2s"},
		{map[string]string{"KUMIKO_SAMPLE_CRON": "@every 2s", "KUMIKO_DEV": "1"}, "@every 2s"},
	} {
		cfg, err := config.FromLookup(func(name string) (string, bool) {
			if name == "DATABASE_URL" {
				return "postgres://kumiko@localhost/kumiko", true
			}
			if name == "APP_MODE" {
				return string(config.ModeWorker), true
			}
			v, ok := tc.env[name]
			return v, ok
		})
		require.NoError(t, err)
		reg := framework.NewRegistry()
		features.RegisterWith(reg, cfg)
		require.NoError(t, reg.Build())
		require.Equal(t, tc.want, spec(t, reg), tc.env)
	}
	reg := framework.NewRegistry()
	features.Register(reg)
	require.NoError(t, reg.Build())
	require.Equal(t, "0 2 * * *", spec(t, reg), "Register: the defaults")
}

func spec(t *testing.T, reg *framework.Registry) string {
	t.Helper()
	for _, j := range jobs.For(reg).Jobs() {
		if j.Name() == "users:job:nightly-report" {
			return j.Spec()
		}
	}
	t.Fatal("users:job:nightly-report is not registered")
	return ""
}
