package jobs_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/jobs"
)

// abortGate is a log handler that holds asynq's worker in its shutdown
// abort branch ("Quitting worker", logged just before it puts the run back
// on its queue) until the run's handler has returned and the runner has
// had its say, so that the handler's error lands exactly as asynq gives
// up on the run.
type abortGate struct {
	logged
	once    sync.Once
	quit    chan struct{}
	settled chan struct{}
}

func (g *abortGate) Handle(ctx context.Context, r slog.Record) error {
	_ = g.logged.Handle(ctx, r)
	if r.Message == "job archived" || r.Message == "job failed, will retry" {
		close(g.settled)
	}
	if r.Message != "asynq warning" {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "detail" && strings.Contains(a.Value.String(), "Quitting worker") {
			g.once.Do(func() {
				close(g.quit)
				select {
				case <-g.settled:
				case <-time.After(time.Second):
				}
			})
		}
		return true
	})
	return nil
}
func (g *abortGate) WithAttrs([]slog.Attr) slog.Handler { return g }
func (g *abortGate) WithGroup(string) slog.Handler      { return g }

// TestShutdownAbortIgnoresTheRunsLastError: a handler that returns an
// error just as the ShutdownTimeout passes, while asynq already takes its
// abort branch, has its run put back on the queue. That error is no
// outcome of the run: it is neither counted as failed nor archived, and
// a Unique job's run keeps its uniqueness lock, so no equal run starts
// while it waits to run again.
func TestShutdownAbortIgnoresTheRunsLastError(t *testing.T) {
	t.Parallel()
	gate := &abortGate{quit: make(chan struct{}), settled: make(chan struct{})}
	started := make(chan struct{}, 1)
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "brittle", &jobs.Options{Unique: time.Hour, MaxRetries: -1}, func(ctx context.Context, jc *jobs.Context, in exportInput) error {
			started <- struct{}{}
			<-gate.quit
			return errors.New("report failed")
		})
	})
	r, err := jobs.New(b.rt, b.rdb, &jobs.Config{
		Lanes: jobs.Lanes, ShutdownTimeout: 200 * time.Millisecond, Metrics: b.prom, Logger: slog.New(gate),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	in := exportInput{Report: "r"}
	id, err := r.Client().Dispatch(context.Background(), "test:job:brittle", in, &jobs.DispatchOptions{TenantID: "acme"})
	require.NoError(t, err)
	<-started
	cancel()
	require.NoError(t, <-done)

	run, err := r.Inspector().Get(context.Background(), "", id)
	require.NoError(t, err)
	require.Equal(t, jobs.StatePending, run.State, "asynq put the run back on its queue")
	require.Zero(t, metric(t, b, "kumiko_jobs_failed_total", "job", "test:job:brittle"))
	require.Zero(t, metric(t, b, "kumiko_jobs_archived_total", "job", "test:job:brittle"))
	require.False(t, gate.has("job archived"))
	_, err = r.Client().Dispatch(context.Background(), "test:job:brittle", in, &jobs.DispatchOptions{TenantID: "acme"})
	require.ErrorIs(t, err, jobs.ErrDuplicate, "the requeued run still holds the Unique window")
}
