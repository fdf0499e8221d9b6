// Package features lists the sample features the kumiko binary serves. An
// application of its own writes the same few lines with its features.
package features

import (
	"github.com/kumiko-go/kumiko/config"
	"github.com/kumiko-go/kumiko/features/demo"
	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/features/users"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/web"
)

// DevNightlyReportSpec is the schedule of users:job:nightly-report with
// [config.Config.Dev]: every minute.
const DevNightlyReportSpec = "*/1 * * * *"

// Register adds every sample feature to r with their defaults (the nightly
// report at 02:00 UTC). It is [RegisterWith] with a nil configuration.
func Register(r *framework.Registry) { RegisterWith(r, nil) }

// RegisterWith adds every sample feature to r, set up from cfg: the users
// feature's nightly report runs on cfg.SampleCron (KUMIKO_SAMPLE_CRON) when
// it is set, else every minute when cfg.Dev (KUMIKO_DEV) is, else at 02:00
// UTC. A nil cfg means the defaults. The kumiko binary calls it with the
// configuration each command loaded.
func RegisterWith(r *framework.Registry, cfg *config.Config) {
	orders.Register(r)
	users.RegisterWith(r, usersOptions(cfg))
}

// usersOptions picks the users feature's options from cfg.
func usersOptions(cfg *config.Config) *users.Options {
	switch {
	case cfg == nil:
		return nil
	case cfg.SampleCron != "":
		return &users.Options{NightlyReportSpec: cfg.SampleCron}
	case cfg.Dev:
		return &users.Options{NightlyReportSpec: DevNightlyReportSpec}
	}
	return nil
}

// Routes adds the sample app's own pages to the HTTP server: the demo page
// at / (orders placed and listed live over SSE).
func Routes(s *web.Server) {
	demo.Mount(s)
}
