package dispatcher_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/dispatcher"
)

// TestConcurrentRunsWakesAndRunOnce hammers the dispatcher's concurrent
// surface: two processes' dispatchers run the same shared consumer, writers
// wake them after every commit, a tool's RunOnce passes run beside them, and
// Run's context ends while they are busy. Every event is delivered exactly
// once, in order, nothing races, and Run returns.
func TestConcurrentRunsWakesAndRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) { recorder(b, "a", nil) })
	var ds []*dispatcher.Dispatcher
	for _, inst := range []string{"pod-1", "pod-2"} {
		d, err := dispatcher.New(b.db.Pool, b.reg, dispatcher.ProjectionConsumers(b.reg, nil),
			&dispatcher.Config{InstanceID: inst, PollInterval: 50 * time.Millisecond, NotifyInterval: 5 * time.Millisecond})
		require.NoError(t, err)
		ds = append(ds, d)
	}
	b.rt.OnCommit(func(int) {
		for _, d := range ds {
			d.Wake()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	for _, d := range ds {
		runs.Go(func() { require.NoError(t, d.Run(ctx)) })
	}
	const writers, each = 4, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() { b.write(t, "t1", w*each, each, 3) })
	}
	stop := make(chan struct{})
	var tools sync.WaitGroup
	tools.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = ds[0].RunOnce(context.Background(), "test:a")
			ds[1].Wake()
		}
	})
	wg.Wait()
	waitCount(t, b, `SELECT count(*) FROM seen WHERE consumer = 'a'`, writers*each, 30*time.Second)
	cancel()
	done := make(chan struct{})
	go func() { runs.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	close(stop)
	tools.Wait()
	require.Equal(t, writers*each, count(t, b, `SELECT count(DISTINCT position) FROM seen WHERE consumer = 'a'`))
	require.Equal(t, writers*each, count(t, b, `SELECT count(*) FROM seen WHERE consumer = 'a'`), "delivered once each")
	require.Equal(t, 0, count(t, b, `SELECT count(*) FROM (SELECT (e.commit_key, e.position) < lag((e.commit_key, e.position)) OVER (ORDER BY s.ctid) AS back
		FROM seen s JOIN events e ON e.position = s.position WHERE s.consumer = 'a') x WHERE back`), "in delivery order (commit key, position)")
	for _, d := range ds {
		d.Wake() // after Run: never blocks
	}
}
