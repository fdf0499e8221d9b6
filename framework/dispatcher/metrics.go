package dispatcher

import (
	"github.com/prometheus/client_golang/prometheus"

	kmetrics "github.com/kumiko-go/kumiko/framework/metrics"
)

// metrics are the dispatcher's Prometheus collectors.
type metrics struct {
	lag        *prometheus.GaugeVec
	processed  *prometheus.CounterVec
	failed     *prometheus.CounterVec
	lost       *prometheus.CounterVec
	visibility prometheus.Gauge
	listen     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kumiko_event_consumer_lag_events",
			Help: "Events of the consumer's types after its cursor (visible or not yet).",
		}, []string{"consumer", "instance_id"}),
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_event_consumer_events_processed_total",
			Help: "Events delivered to the consumer whose cursor advance committed.",
		}, []string{"consumer", "instance_id"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_event_consumer_events_failed_total",
			Help: "Handler failures of the consumer.",
		}, []string{"consumer", "instance_id"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kumiko_event_consumer_passes_lost_total",
			Help: "Passes of the consumer lost under a handler (connection ended, deadlock or serialization victim): no failure of the event, which is retried without counting an attempt. A deadlock or serialization victim at the same event more than 5 times in a row in one process counts as the event's failure instead (kumiko_event_consumer_events_failed_total).",
		}, []string{"consumer", "instance_id"}),
		visibility: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kumiko_event_visibility_lag_seconds",
			Help: "Age of the oldest open transaction holding an xid: how long it holds back the event visibility horizon of every reader in the cluster.",
		}),
		listen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kumiko_dispatcher_listen_connected",
			Help: "1 while the dispatcher's LISTEN connection is up, 0 otherwise (polling still delivers).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.lag, err = kmetrics.Register(reg, m.lag); err != nil {
		return nil, err
	}
	if m.processed, err = kmetrics.Register(reg, m.processed); err != nil {
		return nil, err
	}
	if m.failed, err = kmetrics.Register(reg, m.failed); err != nil {
		return nil, err
	}
	if m.lost, err = kmetrics.Register(reg, m.lost); err != nil {
		return nil, err
	}
	if m.visibility, err = kmetrics.Register(reg, m.visibility); err != nil {
		return nil, err
	}
	if m.listen, err = kmetrics.Register(reg, m.listen); err != nil {
		return nil, err
	}
	return m, nil
}
