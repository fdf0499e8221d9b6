package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/metrics"
)

func TestRegisterSharesTheExistingCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "kumiko_test_total", Help: "test"}
	first, err := metrics.Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	second, err := metrics.Register(reg, prometheus.NewCounter(opts))
	require.NoError(t, err)
	second.Inc()
	require.Same(t, first, second)

	// Another kind of collector under the same name is refused.
	_, err = metrics.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "kumiko_test_total", Help: "other"}))
	require.Error(t, err)
}
