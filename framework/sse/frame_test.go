package sse

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// TestEncodeFrameRoundTrip: what encodeFrame writes, a Reader (and so an
// EventSource) reads back unchanged.
func TestEncodeFrameRoundTrip(t *testing.T) {
	t.Parallel()
	env := framework.Envelope{
		Position: 42, CommitKey: 77, TenantID: "acme", StreamType: "order", StreamID: "o-1", Version: 3,
		Type: "orders:event:placed", Payload: json.RawMessage("{\n  \"customer\": \"a\\nb\",\n  \"n\": 1\n}"),
		Metadata:  eventstore.Metadata{CorrelationID: "c-1", CausationID: "r-1", UserID: "u"},
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
	frame := encodeFrame(env, env.Payload)
	require.Equal(t, 4, bytes.Count(frame, []byte("\n")), "one line per field: a payload line break would split the data")
	r := NewReader(bytes.NewReader(append([]byte("retry: 2000\n\n: hello\n\n"), frame...)))
	ev, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, "77-42", ev.ID)
	require.Equal(t, "orders:event:placed", ev.Type)
	require.Equal(t, 2*time.Second, r.Retry())
	require.Equal(t, 1, r.Comments())
	var d Data
	require.NoError(t, json.Unmarshal(ev.Data, &d))
	require.Equal(t, Data{ID: "77-42", Position: 42, Type: "orders:event:placed", Stream: Stream{Type: "order", ID: "o-1"}, Version: 3,
		Payload: json.RawMessage(`{"customer":"a\nb","n":1}`), CorrelationID: "c-1", CausationID: "r-1", UserID: "u", CreatedAt: env.CreatedAt}, d)
	_, err = r.Next()
	require.ErrorIs(t, err, io.EOF)
}

// TestReaderSpec follows the SSE parsing rules: line endings, multi-line
// data, the optional space, events without data, ids kept across events.
func TestReaderSpec(t *testing.T) {
	t.Parallel()
	in := "id: 1\r\ndata:a\r\ndata: b\r\n\r\n" + // CRLF, two data lines
		"event: x\rdata: c\r\r" + // CR only
		"event: empty\n\n" + // no data: not dispatched
		"data: d\n\n" + // id carried over, type defaults
		"id\ndata: e\n\n" + // an empty id resets it
		"data: unterminated"
	r := NewReader(strings.NewReader(in))
	var got []Event
	for {
		ev, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got = append(got, ev)
	}
	require.Equal(t, []Event{
		{ID: "1", Type: "message", Data: []byte("a\nb")},
		{ID: "1", Type: "x", Data: []byte("c")},
		{ID: "1", Type: "message", Data: []byte("d")},
		{ID: "", Type: "message", Data: []byte("e")},
	}, got)
}

func TestParseEventID(t *testing.T) {
	t.Parallel()
	c, err := ParseEventID("123-45")
	require.NoError(t, err)
	require.Equal(t, eventstore.Cursor{CommitKey: 123, Position: 45}, c)
	for _, bad := range []string{"", "1", "-1", "1-", "a-1", "1-0", "01-5", "1-05", "+1-5", "1-+5", "1--5", "18446744073709551616-1", " 1-5"} {
		_, err := ParseEventID(bad)
		require.ErrorIs(t, err, ErrBadEventID, bad)
	}
}

func FuzzParseEventID(f *testing.F) {
	for _, s := range []string{"123-45", "0-1", "18446744073709551615-9223372036854775807", "x", "1-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseEventID(s)
		if err != nil {
			return
		}
		if c.String() != s || c.Position <= 0 {
			t.Fatalf("%q parsed to %v", s, c)
		}
	})
}

func FuzzReader(f *testing.F) {
	f.Add([]byte("id: 1\ndata: x\n\n"))
	f.Add([]byte("retry: 10\r\n: c\r\nevent: e\rdata\n\n"))
	f.Add(encodeFrame(framework.Envelope{Position: 1, CommitKey: 2, Type: "a:event:b", Payload: json.RawMessage(`{}`)}, json.RawMessage(`{}`)))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(bytes.NewReader(b))
		for range 1000 {
			ev, err := r.Next()
			if err != nil {
				return
			}
			if ev.Type == "" {
				t.Fatal("an event without type")
			}
		}
	})
}

func FuzzEncodeFrame(f *testing.F) {
	f.Add("orders:event:placed", "order", "o-1", []byte(`{"a":"b\nc"}`))
	f.Fuzz(func(t *testing.T, typ, st, sid string, payload []byte) {
		if !json.Valid(payload) || strings.ContainsAny(typ, "\r\n") || !utf8.ValidString(sid) {
			return // types are kebab-case names, payloads jsonb, ids Postgres text
		}
		env := framework.Envelope{Position: 9, CommitKey: 8, Type: typ, StreamType: st, StreamID: sid, Payload: payload}
		ev, err := NewReader(bytes.NewReader(encodeFrame(env, payload))).Next()
		require.NoError(t, err)
		require.Equal(t, "8-9", ev.ID)
		var d Data
		require.NoError(t, json.Unmarshal(ev.Data, &d))
		require.Equal(t, sid, d.Stream.ID)
		require.JSONEq(t, string(payload), string(d.Payload))
	})
}

func TestFilterMatch(t *testing.T) {
	t.Parallel()
	require.True(t, Filter{}.Match("a", "b"))
	f := Filter{Types: []string{"x:event:a"}, StreamTypes: []string{"order"}}
	require.True(t, f.Match("x:event:a", "order"))
	require.False(t, f.Match("x:event:b", "order"))
	require.False(t, f.Match("x:event:a", "memo"))
}

// TestReaderLastIDIgnoresIncompleteFrame: a stream cut inside a frame (a
// write cut at drain, a dropped connection) after its id line but before
// its end must not move LastID: the event was never delivered, and a
// client that resumes with LastID would skip it. An EventSource only takes
// the id over when the frame ends.
func TestReaderLastIDIgnoresIncompleteFrame(t *testing.T) {
	t.Parallel()
	r := NewReader(strings.NewReader("id: 1-1\nevent: a\ndata: x\n\nid: 2-2\nevent: a\ndata: {\"n\""))
	ev, err := r.Next()
	require.NoError(t, err)
	require.Equal(t, "1-1", ev.ID)
	_, err = r.Next()
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, "1-1", r.LastID(), "the cut frame's id was taken over")
}
