package sse_test

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
)

// Slowed is the payload of sse-test:event:slowed (version 2).
type Slowed struct {
	Name string `json:"name"`
}

// TestSlowUpcasterBlocksNoOne: the hub encodes live events with the
// application's upcasters. While one is slow, the hub's lock must not be
// held: new clients still connect, Clients answers, and events keep being
// published; the slow event then reaches its client in order.
func TestSlowUpcasterBlocksNoOne(t *testing.T) {
	t.Parallel()
	b, h := setupSlowUpcaster(t)
	entered, release := h.entered, h.release
	defer release()
	c := b.connect(t, request{tenant: "t-slow"})
	apply := b.hub.Consumer().Apply
	env := func(pos int64, payload string) framework.Envelope { return h.env("t-slow", pos, payload) }
	require.NoError(t, apply(context.Background(), nil, env(1<<40, `{"slow":true}`)))
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the upcaster was not called")
	}

	// The upcaster is stuck: the hub still takes clients and events.
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.Equal(t, 1, b.hub.Clients())
		assert.NoError(t, apply(context.Background(), nil, env(1<<40+1, `{"fast":true}`)))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "t-slow"}))
		if assert.NoError(t, err) {
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			_ = resp.Body.Close()
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		release()
		<-done
		t.Fatal("a slow upcaster held the hub's lock: Clients, Publish and new clients waited for it")
	}
	release()
	evs := c.waitFor(t, 2)
	require.Contains(t, string(evs[0].Data), `"payload":{"name":"slow"}`)
	require.Contains(t, string(evs[1].Data), `"payload":{"name":"fast"}`)
}

// slowUpcaster is a hub whose sse-test:event:slowed upcaster (from version
// 1) holds the event {"slow":true} until release: entered is closed when
// it does. Its other events upcast to {"name":"fast"} at once.
type slowUpcaster struct {
	slowed  framework.EventType[Slowed]
	entered chan struct{}
	release func()
}

// env is a slowed event of tenant at pos with a version-1 payload.
func (h *slowUpcaster) env(tenant string, pos int64, payload string) framework.Envelope {
	return framework.Envelope{Position: pos, CommitKey: 1 << 62, TenantID: tenant, StreamType: "k", StreamID: "s",
		Version: pos, Type: h.slowed.Name(), TypeVersion: 1, Payload: []byte(payload), CreatedAt: time.Now()}
}

func setupSlowUpcaster(t *testing.T) (*bundle, *slowUpcaster) {
	t.Helper()
	h := &slowUpcaster{entered: make(chan struct{})}
	gate := make(chan struct{})
	var enterOnce, releaseOnce sync.Once
	h.release = func() { releaseOnce.Do(func() { close(gate) }) }
	b := setupWith(t, nil, func(reg *framework.Registry) {
		h.slowed = framework.DefineEvent[Slowed](reg.Feature("sse-test"), "slowed", &framework.EventOptions{
			Version: 2,
			Upcasters: map[int]framework.Upcaster{1: func(p json.RawMessage) (json.RawMessage, error) {
				if string(p) == `{"slow":true}` {
					enterOnce.Do(func() { close(h.entered) })
					<-gate
					return json.RawMessage(`{"name":"slow"}`), nil
				}
				return json.RawMessage(`{"name":"fast"}`), nil
			}},
		})
	})
	return b, h
}
