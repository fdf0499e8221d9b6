package sse_test

import (
	"encoding/json"
	"testing"

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
	// A version-1 row without "name", as an older release wrote it.
	requireNotStreamed(t, b, "person", eventstore.NewEvent{Type: "sse-test:event:renamed", TypeVersion: 1, Payload: []byte(`{"nick":"old-field"}`)})
}

// TestUpcasterReturningNoJSONIsNotStreamed: an upcaster that returns bytes
// that are not JSON (a hand-built payload with a bug) fails like one that
// returns an error: every other reader fails to decode such an event, and
// the stream must not send it as a string in place of the payload object
// the clients know.
func TestUpcasterReturningNoJSONIsNotStreamed(t *testing.T) {
	t.Parallel()
	b := setupWith(t, nil, func(reg *framework.Registry) {
		framework.DefineEvent[Renamed](reg.Feature("sse-test"), "renamed", &framework.EventOptions{
			Version: 2,
			Upcasters: map[int]framework.Upcaster{1: func(p json.RawMessage) (json.RawMessage, error) {
				return json.RawMessage(`{"fullName":"old-field"`), nil // the closing brace forgotten
			}},
		})
	})
	requireNotStreamed(t, b, "person", eventstore.NewEvent{Type: "sse-test:event:renamed", TypeVersion: 1, Payload: []byte(`{"name":"x"}`)})
}
