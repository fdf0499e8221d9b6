package jobs

import (
	"github.com/prometheus/client_golang/prometheus"

	kmetrics "github.com/kumiko-go/kumiko/framework/metrics"
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
			Help:    "Time from the triggering event's append (its created_at) to the start of an event job's run (its first attempt).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, lj),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.enqueued, err = kmetrics.Register(reg, m.enqueued); err != nil {
		return nil, err
	}
	if m.succeeded, err = kmetrics.Register(reg, m.succeeded); err != nil {
		return nil, err
	}
	if m.failed, err = kmetrics.Register(reg, m.failed); err != nil {
		return nil, err
	}
	if m.retried, err = kmetrics.Register(reg, m.retried); err != nil {
		return nil, err
	}
	if m.archived, err = kmetrics.Register(reg, m.archived); err != nil {
		return nil, err
	}
	if m.depth, err = kmetrics.Register(reg, m.depth); err != nil {
		return nil, err
	}
	if m.eventToStart, err = kmetrics.Register(reg, m.eventToStart); err != nil {
		return nil, err
	}
	return m, nil
}

// startLane puts the run counters of the jobs a lane runs on /metrics at 0,
// so that increase() and rate() see a job's first failure or archived run
// instead of a series that appears with it.
func (m *metrics) startLane(lane string, jobs []*Job) {
	for _, j := range jobs {
		for _, c := range []*prometheus.CounterVec{m.succeeded, m.failed, m.retried, m.archived} {
			c.WithLabelValues(lane, j.name)
		}
	}
}
