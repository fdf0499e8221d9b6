package sse_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

// Renamed is the payload of sse-test:event:renamed (version 2).
type Renamed struct {
	Name string `json:"name"`
}

// TestUpcasterPanicDoesNotCrashTheHub: the hub's fan-out goroutine runs
// the application's upcasters (a live event an older build appended during
// a rolling deploy). A panic there must not take the process down (the
// dispatcher and the HTTP server recover from the application's panics
// too): the event goes out with its stored payload, as after an upcaster's
// error, and the stream goes on.
func TestUpcasterPanicDoesNotCrashTheHub(t *testing.T) {
	t.Parallel()
	var renamed framework.EventType[Renamed]
	b := setupWith(t, nil, func(reg *framework.Registry) {
		renamed = framework.DefineEvent[Renamed](reg.Feature("sse-test"), "renamed", &framework.EventOptions{
			Version: 2,
			Upcasters: map[int]framework.Upcaster{1: func(p json.RawMessage) (json.RawMessage, error) {
				var m map[string]any
				if err := json.Unmarshal(p, &m); err != nil {
					return nil, err
				}
				return json.Marshal(map[string]any{"name": m["old"].(string)}) // panics without "old"
			}},
		})
	})
	c := b.connect(t, request{tenant: "t-up"})
	apply := b.hub.Consumer().Apply
	env := func(pos int64, payload string) framework.Envelope {
		return framework.Envelope{Position: pos, CommitKey: 1 << 62, TenantID: "t-up", StreamType: "k", StreamID: "s",
			Version: pos, Type: renamed.Name(), TypeVersion: 1, Payload: []byte(payload), CreatedAt: time.Now()}
	}
	require.NoError(t, apply(context.Background(), nil, env(1<<40, `{"bad":1}`)))
	require.NoError(t, apply(context.Background(), nil, env(1<<40+1, `{"old":"x"}`)))
	evs := c.waitFor(t, 2)
	require.Contains(t, string(evs[0].Data), `"payload":{"bad":1}`, "sent with its stored payload")
	require.Contains(t, string(evs[1].Data), `"payload":{"name":"x"}`)
}
