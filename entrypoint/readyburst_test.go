package entrypoint_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadyProbesShareOneRun: /health/ready needs no token, so anyone who
// reaches the API port can send a burst of probes. Probes that arrive while
// the checks run share that run's answer: a burst takes a few of the pool's
// connections, not four per probe, so it neither starves writes nor makes
// the checks time out on the pool (a 503 that takes the process out of its
// load balancer).
func TestReadyProbesShareOneRun(t *testing.T) {
	t.Parallel()
	fa := newFuzzApp(t)
	pool := fa.app.Pool()
	const probes = 40
	before := pool.Stat().AcquireCount()
	codes := make([]int, probes)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range probes {
		wg.Go(func() {
			<-start
			codes[i] = fa.serve(t, http.MethodGet, "/health/ready", nil, nil, 0).Code
		})
	}
	close(start)
	wg.Wait()
	acquired := pool.Stat().AcquireCount() - before
	for i, code := range codes {
		require.Equal(t, http.StatusOK, code, "probe %d", i)
	}
	// Four checks take a connection each; unshared, the burst takes 160.
	require.Less(t, acquired, int64(probes), "connections taken by %d concurrent probes", probes)
}
