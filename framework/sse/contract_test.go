package sse_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestDroppedClientCatchesUp: a client that stops reading is dropped; the
// complete frames it did receive, followed by what a reconnect with the last
// of their ids brings, are the tenant's log exactly.
func TestDroppedClientCatchesUp(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{Buffer: 16, WriteTimeout: 2 * time.Second})
	// A receive buffer set before connecting, small enough to fill soon
	// and large enough (with TCP window scaling) to be read back quickly
	// once the client reads again: a tiny one drains at some 40 KB/s.
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 256<<10)
		})
		return cmp.Or(err, serr)
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer %s\r\n\r\n", sse.Path, b.token(t, "acme"))
	require.NoError(t, err)
	eventually(t, "client connected", func() bool { return b.hub.Clients() == 1 })
	// One small event read, so that the client has an id to resume from
	// however early it is dropped; then it stops reading.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	rd := sse.NewReader(resp.Body)
	requireOpen(t, rd)
	b.note(t, "acme", "memo", -1, "first")
	first, err := rd.Next()
	require.NoError(t, err)
	got := []string{first.ID}

	big := strings.Repeat("y", 50_000)
	for i := 0; b.hub.Clients() == 1; i++ {
		require.Less(t, i, 400, "the client that does not read was never dropped")
		b.note(t, "acme", "memo", i, big)
	}
	require.InDelta(t, 1, b.metric(t, "kumiko_sse_dropped_clients_total"), 0)

	// Now read what reached the client, up to where the server cut it.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
	for {
		ev, err := rd.Next()
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the dropped connection was not closed")
			break
		}
		got = append(got, ev.ID)
	}
	t.Logf("the dropped client got %d of %d events", len(got), len(b.logOf(t, "acme")))

	for i := range 3 {
		b.note(t, "acme", "memo", 1000+i, "after")
	}
	want := b.logOf(t, "acme")
	// Reconnect as a browser does, from the last complete frame, until
	// the stream has caught up: under load a resumed stream may be
	// dropped again (its buffer overflows while the hub still broadcasts
	// the burst), and resumes the same way.
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 10, "no catching up: %d of %d events", len(got), len(want))
		again := b.connect(t, request{tenant: "acme", lastID: got[len(got)-1]})
		need := len(want) - len(got)
		deadline := time.Now().Add(wait)
		dropped := false
		for !dropped && len(again.snapshot()) < need {
			require.True(t, time.Now().Before(deadline), "got %d events, want %d", len(again.snapshot()), need)
			select {
			case <-again.done:
				dropped = true
			case <-time.After(10 * time.Millisecond):
			}
		}
		if !dropped {
			time.Sleep(100 * time.Millisecond) // a duplicate would show
		}
		again.close()
		got = append(got, ids(again.snapshot())...)
		if !dropped {
			break
		}
		t.Logf("the resumed stream was dropped again after %d of %d events", len(again.snapshot()), need)
	}
	require.Equal(t, want, got, "the log exactly: no gap, no duplicate")
}

// Titled is version 3 of sse-test:event:titled: version 1 had "name",
// version 2 "title".
type Titled struct {
	Heading string `json:"heading"`
}

// TestUpcastEventsStreamed: events stored at older versions of their type
// are sent upcast to the current one, live and on replay, with the stream
// version (not the type version) in version.
func TestUpcastEventsStreamed(t *testing.T) {
	t.Parallel()
	rename := func(from, to string) framework.Upcaster {
		return func(p json.RawMessage) (json.RawMessage, error) {
			var m map[string]any
			if err := json.Unmarshal(p, &m); err != nil {
				return nil, err
			}
			m[to] = m[from]
			delete(m, from)
			return json.Marshal(m)
		}
	}
	b := setupWith(t, nil, func(reg *framework.Registry) {
		framework.DefineEvent[Titled](reg.Feature("sse-test"), "titled", &framework.EventOptions{
			Version:   3,
			Upcasters: map[int]framework.Upcaster{1: rename("name", "title"), 2: rename("title", "heading")},
		})
	})
	live := b.connect(t, request{tenant: "acme", query: "types=sse-test:event:titled"})
	b.note(t, "acme", "memo", 0, "first")
	// The marker: a resume from it replays all that follows.
	all := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "marker")
	marker := all.waitFor(t, 1)[0].ID
	sid := uuid.NewString()
	_, err := eventstore.Append(context.Background(), b.db.Pool,
		eventstore.StreamRef{TenantID: "acme", Type: "doc", ID: sid}, eventstore.NoStream, []eventstore.NewEvent{
			{Type: "sse-test:event:titled", TypeVersion: 1, Payload: []byte(`{"name":"one"}`)},
			{Type: "sse-test:event:titled", TypeVersion: 2, Payload: []byte(`{"title":"two"}`)},
			{Type: "sse-test:event:titled", TypeVersion: 3, Payload: []byte(`{"heading":"three"}`)},
		})
	require.NoError(t, err)

	check := func(evs []sse.Event) {
		t.Helper()
		require.Len(t, evs, 3)
		for i, ev := range evs {
			var d sse.Data
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			require.Equal(t, int64(i+1), d.Version)
			require.Equal(t, sid, d.Stream.ID)
			require.JSONEq(t, fmt.Sprintf(`{"heading":%q}`, []string{"one", "two", "three"}[i]), string(d.Payload))
		}
	}
	check(live.waitFor(t, 3))
	check(b.connect(t, request{tenant: "acme", lastID: marker, query: "types=sse-test:event:titled"}).waitFor(t, 3))
	time.Sleep(100 * time.Millisecond)
	require.Len(t, live.snapshot(), 3)
}
