package sse

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// Limits of the filter parameters.
const (
	// MaxFilterValues is the most event types, and the most stream types, a
	// filter may name.
	MaxFilterValues = 50
	maxStreamType   = 100
)

// encodeFrame renders one event frame. The data line is compact JSON, so it
// contains no line break.
func encodeFrame(env framework.Envelope, payload json.RawMessage) []byte {
	d := Data{
		ID:            env.Cursor().String(),
		Position:      env.Position,
		Type:          env.Type,
		Stream:        Stream{Type: env.StreamType, ID: env.StreamID},
		Version:       env.Version,
		Payload:       payload,
		CorrelationID: env.Metadata.CorrelationID,
		CausationID:   env.Metadata.CausationID,
		UserID:        env.Metadata.UserID,
		CreatedAt:     env.CreatedAt,
	}
	data, err := json.Marshal(d)
	if err != nil { // a stored payload that is not JSON: send it as a string
		d.Payload, _ = json.Marshal(string(payload))
		data, _ = json.Marshal(d)
	}
	var b bytes.Buffer
	b.Grow(len(data) + len(env.Type) + 48)
	b.WriteString("id: ")
	b.WriteString(d.ID)
	b.WriteString("\nevent: ")
	b.WriteString(env.Type)
	b.WriteString("\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	return b.Bytes()
}

// OpenEvent is the event name of the frame every stream opens with, before
// any event frame. It can never be an event type (those are
// <feature>:event:<name>); an EventSource listening for event types
// ignores it. Its data is an [Open]; it has no id, so it moves no client's
// resume point.
const OpenEvent = "kumiko:open"

// Open is the JSON of the opening frame's data.
type Open struct {
	// ConsistencyToken is a WAL position of the primary at or past the
	// commit of every event the stream will not send (the events up to
	// where it starts, or up to the Last-Event-ID it resumes from): a
	// query that sends it back, as a write's token, sees all of them even
	// on a replica that lags. A client that opened the stream without an
	// id loads its state with it.
	ConsistencyToken string `json:"consistencyToken"`
}

// encodeOpen renders the opening frame.
func encodeOpen(token string) []byte {
	data, _ := json.Marshal(Open{ConsistencyToken: token})
	return []byte("event: " + OpenEvent + "\ndata: " + string(data) + "\n\n")
}

// Filter narrows a stream to some event types and stream (aggregate) types.
// An empty list matches everything.
type Filter struct {
	// Types are qualified event types, e.g. "orders:event:placed".
	Types []string
	// StreamTypes are aggregate types, e.g. "order".
	StreamTypes []string
}

// Match reports whether an event of eventType in a stream of streamType
// passes the filter.
func (f Filter) Match(eventType, streamType string) bool {
	return matchAny(f.Types, eventType) && matchAny(f.StreamTypes, streamType)
}

func matchAny(list []string, v string) bool {
	if len(list) == 0 {
		return true
	}
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// ParseFilter reads the filter of an SSE request: the query parameters
// `types` (event types) and `streamTypes` (stream types), each
// comma-separated and repeatable; a parameter left out is no filter. An
// event type that reg does not declare or declares internal
// ([framework.EventOptions].Internal), a malformed stream type, more than
// [MaxFilterValues] values, or a parameter that is present but names
// nothing (?types=, ?types=,,) is a *framework.ValidationError: a client
// whose list came out empty must not get every type.
func ParseFilter(q url.Values, reg *framework.Registry) (Filter, error) {
	var f Filter
	var fields []framework.FieldError
	f.Types = splitList(q["types"])
	f.StreamTypes = splitList(q["streamTypes"])
	for _, p := range []struct {
		name, what string
		list       []string
	}{{"types", "event type", f.Types}, {"streamTypes", "stream type", f.StreamTypes}} {
		if q.Has(p.name) && len(p.list) == 0 {
			fields = append(fields, framework.FieldError{Field: p.name, Rule: "required",
				Message: fmt.Sprintf("%s names no %s; leave it out to receive every %s", p.name, p.what, p.what)})
		}
	}
	if len(f.Types) > MaxFilterValues {
		fields = append(fields, framework.FieldError{Field: "types", Rule: "max", Param: strconv.Itoa(MaxFilterValues),
			Message: fmt.Sprintf("types names more than %d event types", MaxFilterValues)})
	} else {
		for _, t := range f.Types {
			switch {
			case !reg.HasEvent(t):
				fields = append(fields, framework.FieldError{Field: "types", Rule: "event_type",
					Message: fmt.Sprintf("types: %q is not a declared event type", framework.Excerpt(t))})
			case reg.InternalEvent(t):
				fields = append(fields, framework.FieldError{Field: "types", Rule: "event_type",
					Message: fmt.Sprintf("types: %q is internal and never sent on the stream", framework.Excerpt(t))})
			}
		}
	}
	if len(f.StreamTypes) > MaxFilterValues {
		fields = append(fields, framework.FieldError{Field: "streamTypes", Rule: "max", Param: strconv.Itoa(MaxFilterValues),
			Message: fmt.Sprintf("streamTypes names more than %d stream types", MaxFilterValues)})
	} else {
		for _, t := range f.StreamTypes {
			if !validStreamType(t) {
				fields = append(fields, framework.FieldError{Field: "streamTypes", Rule: "stream_type",
					Message: fmt.Sprintf("streamTypes: %q is not a stream type (1 to %d printable characters)", framework.Excerpt(t), maxStreamType)})
			}
		}
	}
	if len(fields) > 0 {
		return Filter{}, &framework.ValidationError{Fields: fields}
	}
	return f, nil
}

// splitList splits comma-separated values and drops empty ones.
func splitList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func validStreamType(s string) bool {
	if s == "" || len(s) > maxStreamType || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// ErrBadEventID is returned by [ParseEventID] for a malformed id.
var ErrBadEventID = errors.New("sse: malformed event id")

// ParseEventID parses a frame id (the Last-Event-ID a client sends back).
// Ids are opaque to clients; they are the event's (commit key, position)
// cursor.
func ParseEventID(id string) (eventstore.Cursor, error) {
	if id == "" || len(id) > 41 {
		return eventstore.Cursor{}, ErrBadEventID
	}
	c, err := eventstore.ParseCursor(id)
	if err != nil || c.Position <= 0 || c.String() != id {
		return eventstore.Cursor{}, ErrBadEventID
	}
	return c, nil
}

// Event is one event frame read by a [Reader].
type Event struct {
	// ID is the frame's id field (the last one seen, as the SSE spec says).
	ID string
	// Type is the frame's event field ("message" when absent).
	Type string
	// Data is the frame's data lines joined with "\n".
	Data []byte
}

// Reader parses an SSE stream as a browser's EventSource does: Go clients
// and tests use it.
type Reader struct {
	sc *bufio.Scanner
	// idBuf is the id the current frame set; lastID takes it over when the
	// frame ends (a blank line), as an EventSource's last event ID does.
	idBuf    string
	lastID   string
	retry    time.Duration
	comments int
}

// maxLine bounds one line of a stream a Reader accepts.
const maxLine = 4 << 20

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	sc.Split(scanLines)
	return &Reader{sc: sc}
}

// Retry returns the last retry hint the stream sent (0 if none).
func (r *Reader) Retry() time.Duration { return r.retry }

// Comments returns the number of comment lines (heartbeats) read so far.
func (r *Reader) Comments() int { return r.comments }

// LastID returns the last event id the stream set in a complete frame:
// the id to resume from. An id in a frame the stream ended inside of does
// not count (that event was not delivered).
func (r *Reader) LastID() string { return r.lastID }

// Next returns the next event that has data, skipping comments and frames
// without data. It returns io.EOF at the end of the stream (an incomplete
// last frame is discarded, as the spec says).
func (r *Reader) Next() (Event, error) {
	var data []byte
	hasData := false
	typ := ""
	for r.sc.Scan() {
		line := r.sc.Bytes()
		if len(line) == 0 {
			r.lastID = r.idBuf
			if !hasData {
				typ = ""
				continue
			}
			return Event{ID: r.lastID, Type: cmpOr(typ, "message"), Data: data}, nil
		}
		if line[0] == ':' {
			r.comments++
			continue
		}
		field, value, found := bytes.Cut(line, []byte(":"))
		if found && len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		switch string(field) {
		case "event":
			typ = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				r.idBuf = string(value)
			}
		case "retry":
			if n, err := strconv.ParseUint(string(value), 10, 31); err == nil {
				r.retry = time.Duration(n) * time.Millisecond
			}
		}
	}
	if err := r.sc.Err(); err != nil {
		return Event{}, err
	}
	return Event{}, io.EOF
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// scanLines splits at "\r\n", "\n" or "\r", as the SSE grammar does.
func scanLines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	for i, b := range data {
		switch b {
		case '\n':
			return i + 1, data[:i], nil
		case '\r':
			if i+1 < len(data) {
				if data[i+1] == '\n' {
					return i + 2, data[:i], nil
				}
				return i + 1, data[:i], nil
			}
			if atEOF {
				return i + 1, data[:i], nil
			}
			return 0, nil, nil // a "\n" may follow
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), nil, nil // an unterminated last line is dropped
	}
	return 0, nil, nil
}
