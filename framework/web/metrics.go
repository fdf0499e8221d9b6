package web

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	kmetrics "github.com/kumiko-go/kumiko/framework/metrics"
)

// httpMetrics are the server's Prometheus collectors.
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// newHTTPMetrics registers the HTTP collectors on reg (nil: none). A
// collector already registered under the same name (a second server on
// the same registry) is shared.
func newHTTPMetrics(reg prometheus.Registerer) (*httpMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_http_requests_total",
			Help: "HTTP requests answered, by method, route pattern and status code.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kumiko_http_request_duration_seconds",
			Help:    "HTTP request duration in seconds, by method and route pattern (an SSE stream counts until it ends).",
			Buckets: prometheus.DefBuckets,
		}, []string{"method", "route"}),
	}
	var err error
	if m.requests, err = kmetrics.Register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.duration, err = kmetrics.Register(reg, m.duration); err != nil {
		return nil, err
	}
	return m, nil
}

// observe records one answered request. route is the matched route pattern
// ("" for none, recorded as "unmatched" so that unknown paths cannot blow up
// the label set).
func (m *httpMetrics) observe(method, route string, status int, d time.Duration) {
	if m == nil {
		return
	}
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(method, route, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(method, route).Observe(d.Seconds())
}

// methodLabel bounds the method label to the standard methods.
func methodLabel(m string) string {
	switch m {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE":
		return m
	}
	return "OTHER"
}
