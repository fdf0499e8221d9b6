// Package metrics holds what Kumiko's packages share about Prometheus
// collectors: registering one so that several components of one process
// (two dispatchers, a hub per test server) share it instead of failing.
package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register adds c to reg and returns it, or returns the collector of the
// same description already registered there, so that several components of
// one process share one time series. It fails when reg holds a different
// kind of collector under that name.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("metrics: register: %w", err)
	}
	return c, nil
}
