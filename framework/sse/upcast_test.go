package sse_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// Renamed is version 2 of sse-test:event:renamed (version 1 had "name").
type Renamed struct {
	FullName string `json:"fullName"`
}

// TestUpcasterPanicDoesNotCrashTheStream: an upcaster that panics on one
// stored version-1 event (written live by an older release still rolling,
// or replayed after a reconnect) must neither take the process down (the
// hub's fan-out goroutine has no one above it to recover) nor send that
// event in a schema the clients do not know; the stream goes on with the
// next event, live and on replay.
func TestUpcasterPanicDoesNotCrashTheStream(t *testing.T) {
	t.Parallel()
	b := setupWith(t, nil, func(reg *framework.Registry) {
		framework.DefineEvent[Renamed](reg.Feature("sse-test"), "renamed", &framework.EventOptions{
			Version: 2,
			Upcasters: map[int]framework.Upcaster{1: func(p json.RawMessage) (json.RawMessage, error) {
				var m map[string]any
				if err := json.Unmarshal(p, &m); err != nil {
					return nil, err
				}
				// The kind of bug a real upcaster has: a field it assumed
				// every old row carries.
				return json.Marshal(Renamed{FullName: m["name"].(string)})
			}},
		})
	})
	live := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "before")
	first := live.waitFor(t, 1)
	// A version-1 row without "name", as an older release wrote it.
	_, err := eventstore.Append(context.Background(), b.db.Pool,
		eventstore.StreamRef{TenantID: "acme", Type: "person", ID: uuid.NewString()}, eventstore.AnyVersion,
		[]eventstore.NewEvent{{Type: "sse-test:event:renamed", TypeVersion: 1, Payload: []byte(`{"nick":"old-field"}`)}})
	require.NoError(t, err)
	b.note(t, "acme", "memo", 3, "after")

	evs := live.waitFor(t, 2)
	replayed := b.connect(t, request{tenant: "acme", lastID: first[0].ID})
	rev := replayed.waitFor(t, 1)
	time.Sleep(200 * time.Millisecond) // nothing more may arrive
	for _, ev := range append(live.snapshot(), replayed.snapshot()...) {
		require.NotEqual(t, "sse-test:event:renamed", ev.Type)
		require.NotContains(t, string(ev.Data), "old-field")
	}
	require.Len(t, live.snapshot(), 2)
	require.Len(t, replayed.snapshot(), 1)
	require.Equal(t, ids(evs[1:]), ids(rev))
}
