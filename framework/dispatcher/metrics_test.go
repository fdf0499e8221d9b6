package dispatcher_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// scrape returns the text a /metrics endpoint serves for reg.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// requireLines asserts that every line is one of the scrape's lines.
func requireLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for l := range strings.SplitSeq(text, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		require.True(t, have[l], "/metrics lacks %q:\n%s", l, text)
	}
}

// The dispatcher's metrics carry the names and labels of the issue
// (consumer, instance_id), scraped as /metrics serves them. Every consumer
// of the process has its processed and failed counters from the start, at
// 0: a counter that appears only with its first failure has no sample
// before it, so rate() and increase() miss that failure and an alert on
// them stays silent for the consumer that just broke.
func TestMetricsNameTheConsumerAndInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		recorder(b, "ok", nil)
		recorder(b, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
		q := framework.MultiStreamProjection(b.f, "bad", &framework.ProjectionOptions{MaxAttempts: 2})
		framework.On(q, b.noted, func(context.Context, *framework.Tx, framework.Event[noted]) error {
			return errors.New("always")
		})
	})
	reg := prometheus.NewRegistry()
	d := newDispatcher(t, b, &dispatcher.Config{InstanceID: "m-1", Metrics: reg,
		RetryBaseDelay: time.Millisecond, RetryMaxDelay: 2 * time.Millisecond})

	requireLines(t, scrape(t, reg),
		`kumiko_event_consumer_events_processed_total{consumer="test:ok",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_events_processed_total{consumer="test:local",instance_id="m-1"} 0`,
		`kumiko_event_consumer_events_processed_total{consumer="test:bad",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_events_failed_total{consumer="test:ok",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_events_failed_total{consumer="test:local",instance_id="m-1"} 0`,
		`kumiko_event_consumer_events_failed_total{consumer="test:bad",instance_id="__shared__"} 0`,
		`kumiko_dispatcher_listen_connected 0`,
	)

	b.write(t, "t1", 0, 3, 1)
	drain(t, d, "test:ok", 3)
	drain(t, d, "test:local", 3)
	deadline := time.Now().Add(20 * time.Second)
	for state(t, b, "test:bad", dispatcher.SharedInstance).status != "dead" {
		require.True(t, time.Now().Before(deadline), "test:bad not dead")
		_, err := d.RunOnce(context.Background(), "test:bad")
		require.NoError(t, err)
		time.Sleep(3 * time.Millisecond)
	}
	// A transaction holding an xid holds the horizon back: the visibility
	// lag is its age.
	holder, err := b.db.Pool.Begin(context.Background())
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(context.Background(), `SELECT pg_current_xact_id()`)
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond)
	d.Heartbeat(context.Background())
	text := scrape(t, reg)
	requireLines(t, text,
		`kumiko_event_consumer_events_processed_total{consumer="test:ok",instance_id="__shared__"} 3`,
		`kumiko_event_consumer_events_processed_total{consumer="test:local",instance_id="m-1"} 3`,
		`kumiko_event_consumer_events_processed_total{consumer="test:bad",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_events_failed_total{consumer="test:ok",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_events_failed_total{consumer="test:bad",instance_id="__shared__"} 2`,
		`kumiko_event_consumer_lag_events{consumer="test:ok",instance_id="__shared__"} 0`,
		`kumiko_event_consumer_lag_events{consumer="test:local",instance_id="m-1"} 0`,
		`kumiko_event_consumer_lag_events{consumer="test:bad",instance_id="__shared__"} 3`,
	)
	var visibility float64
	for l := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(l, "kumiko_event_visibility_lag_seconds "); ok {
			var err error
			visibility, err = strconv.ParseFloat(v, 64)
			require.NoError(t, err)
		}
	}
	require.GreaterOrEqual(t, visibility, 1.0, "the open transaction's age")
	require.NoError(t, holder.Rollback(context.Background()))

	// The LISTEN gauge is 1 while the connection is up and 0 once it is
	// gone.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.Run(ctx) })
	waitListening(t, b, 1)
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(scrape(t, reg), "\nkumiko_dispatcher_listen_connected 1\n") {
		require.True(t, time.Now().Before(deadline), "listen gauge not 1")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	requireLines(t, scrape(t, reg), `kumiko_dispatcher_listen_connected 0`)
}
