package jobs

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the jobs' Prometheus collectors.
type metrics struct {
	enqueued     *prometheus.CounterVec
	succeeded    *prometheus.CounterVec
	failed       *prometheus.CounterVec
	retried      *prometheus.CounterVec
	archived     *prometheus.CounterVec
	depth        *prometheus.GaugeVec
	eventToStart *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	lj := []string{"lane", "job"}
	m := &metrics{
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_jobs_enqueued_total",
			Help: "Job runs this process enqueued (duplicates of an existing run not counted).",
		}, lj),
		succeeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_jobs_succeeded_total",
			Help: "Job runs that succeeded.",
		}, lj),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_jobs_failed_total",
			Help: "Job runs that failed (each failure counts; see retried and archived for what followed).",
		}, lj),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_jobs_retried_total",
			Help: "Failed job runs scheduled for a retry.",
		}, lj),
		archived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_jobs_archived_total",
			Help: "Failed job runs archived (retries exhausted or SkipRetry); kumiko jobs retry runs them again.",
		}, lj),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kumiko_jobs_queue_depth",
			Help: "Runs waiting in the lane's queues (pending, scheduled and retry), sampled periodically.",
		}, []string{"lane"}),
		eventToStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kumiko_jobs_event_to_start_seconds",
			Help:    "Time from the triggering event's append (its created_at) to the start of an event job's run.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, lj),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.enqueued, err = register(reg, m.enqueued); err != nil {
		return nil, err
	}
	if m.succeeded, err = register(reg, m.succeeded); err != nil {
		return nil, err
	}
	if m.failed, err = register(reg, m.failed); err != nil {
		return nil, err
	}
	if m.retried, err = register(reg, m.retried); err != nil {
		return nil, err
	}
	if m.archived, err = register(reg, m.archived); err != nil {
		return nil, err
	}
	if m.depth, err = register(reg, m.depth); err != nil {
		return nil, err
	}
	if m.eventToStart, err = register(reg, m.eventToStart); err != nil {
		return nil, err
	}
	return m, nil
}

// register adds c to reg, or returns the collector already registered under
// its name (several runners in one process share them).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing, nil
			}
		}
		return c, fmt.Errorf("jobs: register metrics: %w", err)
	}
	return c, nil
}
