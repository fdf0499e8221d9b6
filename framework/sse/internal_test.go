package sse_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/jobs"
)

// resetMail is the input of a job whose payload no browser may see.
type resetMail struct {
	Email string `json:"email" validate:"required"`
	Token string `json:"token" validate:"required"`
}

// TestInternalEventsNotStreamed: a transactional job dispatch appends
// jobs:event:dispatched, carrying the job's input, to the caller's tenant;
// it is framework plumbing, so neither a live stream nor a replay sends it,
// and a filter cannot ask for it.
func TestInternalEventsNotStreamed(t *testing.T) {
	t.Parallel()
	var mail jobs.ManualJob[resetMail]
	b := setupWith(t, nil, func(reg *framework.Registry) {
		mail = jobs.Manual(reg.Feature("sse-test"), "reset-mail", nil,
			func(context.Context, *jobs.Context, resetMail) error { return nil })
	})
	live := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "before")
	first := live.waitFor(t, 1)
	_, err := b.rt.InTx(context.Background(), "acme", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		if err := tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream,
			b.noted.With(Noted{N: 2, Text: "with a mail"})); err != nil {
			return err
		}
		return mail.DispatchTx(ctx, tx, resetMail{Email: "a@example.com", Token: "s3cret-reset-token"}, nil)
	})
	require.NoError(t, err)
	b.note(t, "acme", "memo", 3, "after")

	evs := live.waitFor(t, 3)
	replayed := b.connect(t, request{tenant: "acme", lastID: first[0].ID})
	rev := replayed.waitFor(t, 2)
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	for _, ev := range append(live.snapshot(), replayed.snapshot()...) {
		require.NotEqual(t, "jobs:event:dispatched", ev.Type)
		require.NotContains(t, string(ev.Data), "s3cret-reset-token")
	}
	require.Len(t, live.snapshot(), 3)
	require.Len(t, replayed.snapshot(), 2)
	require.Equal(t, ids(evs[1:]), ids(rev))

	code, body := b.status(t, request{tenant: "acme", query: "types=jobs:event:dispatched"})
	require.Equal(t, http.StatusBadRequest, code, body)
}

// TestUndeclaredEventsNotStreamed: events of a type this process does not
// declare (a type removed from the code, its events still in the log) have
// no schema the browsers agreed to; neither a live stream nor a replay
// sends them.
func TestUndeclaredEventsNotStreamed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	requireNotStreamed(t, b, "memo", eventstore.NewEvent{Type: "gone:event:removed", TypeVersion: 1, Payload: []byte(`{"secret":"old-field"}`)})
}

// requireNotStreamed appends ev (to a new stream of streamType in tenant
// acme) between two notes and checks that neither a live stream nor a
// replay from the first note sends it (its payload carries "old-field"),
// while both send the note after it.
func requireNotStreamed(t *testing.T, b *bundle, streamType string, ev eventstore.NewEvent) {
	t.Helper()
	live := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "before")
	first := live.waitFor(t, 1)
	_, err := eventstore.Append(context.Background(), b.db.Pool,
		eventstore.StreamRef{TenantID: "acme", Type: streamType, ID: uuid.NewString()}, eventstore.AnyVersion,
		[]eventstore.NewEvent{ev})
	require.NoError(t, err)
	b.note(t, "acme", "memo", 3, "after")

	evs := live.waitFor(t, 2)
	replayed := b.connect(t, request{tenant: "acme", lastID: first[0].ID})
	rev := replayed.waitFor(t, 1)
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	for _, got := range append(live.snapshot(), replayed.snapshot()...) {
		require.NotEqual(t, ev.Type, got.Type)
		require.NotContains(t, string(got.Data), "old-field")
	}
	require.Len(t, live.snapshot(), 2)
	require.Len(t, replayed.snapshot(), 1)
	require.Equal(t, ids(evs[1:]), ids(rev))
}
