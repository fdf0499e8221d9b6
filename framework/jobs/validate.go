package jobs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kumiko-go/kumiko/framework"
)

// Topology describes the process a registry boots in, for [Validate].
type Topology struct {
	// RedisConfigured reports whether the process has a Redis for its jobs.
	RedisConfigured bool
	// APIProcess reports an api process: it enqueues, and consumes the api
	// lane only with RunLocalJobs.
	APIProcess bool
	// RunLocalJobs reports that the api process consumes the api lane.
	RunLocalJobs bool
}

// Validate checks that the jobs of set can run in top, and returns every
// problem at once (nil when there is none): declared jobs need Redis, and
// jobs of the api lane need an api process that consumes it (RunLocalJobs);
// the error names the jobs.
func Validate(set *Set, top Topology) error {
	all := set.Jobs()
	if len(all) == 0 {
		return nil
	}
	var errs []error
	if !top.RedisConfigured {
		errs = append(errs, fmt.Errorf("jobs: %d job(s) are declared (%s) but no Redis is configured: set REDIS_URL", len(all), names(all)))
	}
	if top.APIProcess && !top.RunLocalJobs {
		if api := set.InLane(framework.RunInAPI); len(api) > 0 {
			errs = append(errs, fmt.Errorf("jobs: %s run in the api lane (RunIn api) but this api process does not consume it, so they would never run: set KUMIKO_RUN_LOCAL_JOBS=true or give them RunIn worker", names(api)))
		}
	}
	return errors.Join(errs...)
}

func names(js []*Job) string {
	s := make([]string, len(js))
	for i, j := range js {
		s[i] = j.name
	}
	return strings.Join(s, ", ")
}
