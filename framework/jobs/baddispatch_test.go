package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// TestBadDispatchEnqueuesNothing: a manual dispatch of a name that is no
// manual job (unknown, an event job's, a cron job's) is ErrUnknownJob, and
// a payload that does not fit the job's input (not JSON, not an object, an
// unknown field, a failing validator tag) is a *framework.ValidationError
// (400 validation_error over HTTP); neither Client.Dispatch nor DispatchTx
// leaves a run in any state of either lane or an event in the log.
func TestBadDispatchEnqueuesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "export", nil, func(context.Context, *jobs.Context, exportInput) error { return nil })
		jobs.OnEvent(b.f, "on-noted", b.noted, nil, func(context.Context, *jobs.Context, framework.Event[noted]) error { return nil })
		jobs.Cron(b.f, "hourly", "@hourly", nil, func(context.Context, *jobs.Context, jobs.Tick) error { return nil })
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	ctx := context.Background()
	set := jobs.For(b.reg)
	both := func(name string, payload any) []error {
		_, err := r.Client().Dispatch(ctx, name, payload, &jobs.DispatchOptions{TenantID: "acme"})
		_, txErr := b.rt.InTx(ctx, "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return set.DispatchTx(ctx, tx, name, payload, nil)
		})
		return []error{err, txErr}
	}

	for _, name := range []string{"test:job:nope", "test:job:on-noted", "test:job:hourly", ""} {
		for _, err := range both(name, exportInput{Report: "x"}) {
			require.ErrorIs(t, err, jobs.ErrUnknownJob, name)
			require.Equal(t, framework.CodeInternal, framework.ToError(err).Code, "a programming error, not the caller's input")
		}
	}
	for what, payload := range map[string]any{
		"not JSON":       json.RawMessage(`{"report":`),
		"an array":       json.RawMessage(`[1]`),
		"a string":       "report",
		"unknown field":  map[string]any{"report": "x", "extra": 1},
		"wrong type":     map[string]any{"report": 7},
		"missing":        nil,
		"too long":       exportInput{Report: "this report name is far too long"},
		"trailing value": json.RawMessage(`{"report":"x"} {}`),
	} {
		for _, err := range both("test:job:export", payload) {
			var ve *framework.ValidationError
			require.ErrorAs(t, err, &ve, what)
			require.Equal(t, 400, framework.ToError(err).Code.HTTPStatus(), what)
		}
	}

	// A good dispatch after them runs: the lanes and the trigger consumer
	// were up all along, and it is the only run there is.
	_, err := r.Client().Dispatch(ctx, "test:job:export", exportInput{Report: "ok"}, &jobs.DispatchOptions{TenantID: "acme", Key: "ok"})
	require.NoError(t, err)
	drained(t, r.Inspector())
	for _, st := range jobs.States {
		items, err := r.Inspector().List(ctx, &jobs.ListOptions{State: st, Limit: 100})
		require.NoError(t, err)
		if st == jobs.StateCompleted {
			require.Len(t, items, 1)
			require.JSONEq(t, `{"report":"ok"}`, string(items[0].Input))
			continue
		}
		require.Empty(t, items, "runs %s", st)
	}
	require.Zero(t, b.count(t, `SELECT count(*) FROM events`))
	require.Equal(t, float64(1), metric(t, b, "kumiko_jobs_enqueued_total"))
}

// TestDispatchRefusesATenantIDAuthWouldRefuse: Client.Dispatch (and a
// job's Context.Dispatch, which goes through it) refuses a TenantID that
// no token could carry: longer than auth.MaxIDLength bytes, holding a NUL
// or bytes that are not UTF-8. It enqueued them, and the run then failed
// at every attempt in the database (a key too large for the shared
// indexes, a NUL Postgres cannot store). Nothing is enqueued; a tenant id
// of exactly MaxIDLength bytes runs.
func TestDispatchRefusesATenantIDAuthWouldRefuse(t *testing.T) {
	t.Parallel()
	b := setup(t, func(b *bundle) {
		jobs.Manual[exportInput](b.f, "export", nil, func(context.Context, *jobs.Context, exportInput) error { return nil })
	})
	r := b.runner(t, nil)
	b.dispatch(t, r.Consumer())
	ctx := context.Background()
	for what, tenant := range map[string]string{
		"too long":  strings.Repeat("t", auth.MaxIDLength+1),
		"a NUL":     "ac\x00me",
		"not UTF-8": "ac\xffme",
	} {
		_, err := r.Client().Dispatch(ctx, "test:job:export", exportInput{Report: "x"}, &jobs.DispatchOptions{TenantID: tenant})
		require.ErrorIs(t, err, jobs.ErrInvalidTenantID, what)
		require.Equal(t, framework.CodeInternal, framework.ToError(err).Code, "a programming error: %s", what)
	}
	_, err := r.Client().Dispatch(ctx, "test:job:export", exportInput{Report: "x"},
		&jobs.DispatchOptions{TenantID: strings.Repeat("t", auth.MaxIDLength+1)})
	require.EqualError(t, err, fmt.Sprintf("jobs: invalid tenant id: %d bytes, longer than %d", auth.MaxIDLength+1, auth.MaxIDLength))

	_, err = r.Client().Dispatch(ctx, "test:job:export", exportInput{Report: "ok"},
		&jobs.DispatchOptions{TenantID: strings.Repeat("t", auth.MaxIDLength), Key: "ok"}) // a Key keeps the completed run
	require.NoError(t, err)
	drained(t, r.Inspector())
	for _, st := range jobs.States {
		items, err := r.Inspector().List(ctx, &jobs.ListOptions{State: st, Limit: 100})
		require.NoError(t, err)
		if st == jobs.StateCompleted {
			require.Len(t, items, 1)
			require.Equal(t, strings.Repeat("t", auth.MaxIDLength), items[0].TenantID)
			continue
		}
		require.Empty(t, items, "runs %s", st)
	}
}
