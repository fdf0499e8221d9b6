package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// Upcaster turns a payload of one schema version into the next version's
// JSON (output that is not valid JSON fails the read). It runs on every read (load, dispatch, rebuild); stored rows are
// never rewritten.
type Upcaster func(payload json.RawMessage) (json.RawMessage, error)

// MaxEventVersion is the largest payload schema version (the event log
// stores it as an int4).
const MaxEventVersion = eventstore.MaxTypeVersion

// ErrNewerEventVersion is returned (wrapped) by every read of a stored event
// whose schema version is above the one this code declares for its type:
// a newer release wrote it (during a rolling deploy, or before a rollback),
// and this code cannot know its shape, so it refuses the event rather than
// decode it into the old payload type (a renamed field would read as its
// zero value).
var ErrNewerEventVersion = errors.New("event version newer than declared")

// EventOptions tunes [DefineEvent]. A nil *EventOptions means the defaults.
type EventOptions struct {
	// Version is the current payload schema version. Defaults to 1.
	Version int
	// Upcasters maps a version v (1 <= v < Version) to the function that
	// lifts a v payload to v+1. Every older version needs one, and a key
	// outside 1..Version-1 (an upcaster added without bumping Version) is a
	// registration problem.
	Upcasters map[int]Upcaster
	// PubSub marks a notification type that belongs to no aggregate's
	// history; `kumiko events prune` deletes such types by default. Append
	// it to streams of its own (as jobs:event:dispatched does): a stream
	// that loses events to a prune can no longer be read for folding
	// ([eventstore.ErrTruncated]).
	PubSub bool
	// Internal keeps the event off the live stream to browsers (GET
	// /api/sse, its replay included) and out of its filters, while
	// consumers, projections and jobs get it as usual: every user of a
	// tenant reads that tenant's stream, so framework plumbing and payloads
	// that not every user may read (a job's input, such as a reset token)
	// must not travel on it. jobs:event:dispatched is internal. Defaults
	// to false.
	Internal bool
}

// eventDef is the erased definition behind an EventType handle.
type eventDef struct {
	reg       *Registry
	qualified string
	version   int
	upcasters map[int]Upcaster
	pubSub    bool
	internal  bool
	goType    reflect.Type
}

// EventType is the typed handle of a declared event; keep it in a package
// variable and use it to append ([EventType.With]) and to subscribe ([On]).
type EventType[T any] struct {
	def *eventDef
}

// DefineEvent declares the event "<feature>:event:<name>" with payload type
// T (a struct with validator tags). Declaring the same name twice, an
// invalid name, or a version without its upcasters is a registration problem
// reported by [Registry.Build].
func DefineEvent[T any](f *Feature, name string, opts *EventOptions) EventType[T] {
	if opts == nil {
		opts = &EventOptions{}
	}
	def := &eventDef{
		reg:       f.reg,
		qualified: f.qualify("event", name),
		version:   max(opts.Version, 1),
		upcasters: opts.Upcasters,
		pubSub:    opts.PubSub,
		internal:  opts.Internal,
		goType:    reflect.TypeFor[T](),
	}
	if opts.Version < 0 {
		f.reg.problem("event %s: version %d: versions start at 1 (0 means 1)", def.qualified, opts.Version)
	}
	if def.version > MaxEventVersion {
		// Stored as an int4; and one upcaster per version could never be
		// listed anyway.
		f.reg.problem("event %s: version %d is above the largest, %d", def.qualified, def.version, MaxEventVersion)
		def.version = 1
	}
	for v := 1; v < def.version; v++ {
		if def.upcasters[v] == nil {
			f.reg.problem("event %s: version %d has no upcaster to %d", def.qualified, v, v+1)
		}
	}
	// An upcaster no stored version can reach is a mistake, most often an
	// upcaster added without bumping Version: the code would then append
	// the new shape under the old version number, and once Version is
	// bumped those rows would be upcast a second time.
	for _, v := range slices.Sorted(maps.Keys(def.upcasters)) {
		switch {
		case v < 1:
			f.reg.problem("event %s: upcaster from version %d: versions start at 1", def.qualified, v)
		case v >= def.version:
			f.reg.problem("event %s: upcaster from version %d, but the current version is %d (bump Version to %d)", def.qualified, v, def.version, v+1)
		}
	}
	r := f.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.events[def.qualified]; dup {
		r.problemLocked("event %s declared twice", def.qualified)
	} else {
		r.events[def.qualified] = def
	}
	return EventType[T]{def: def}
}

// Name returns the qualified type name, "<feature>:event:<name>" ("" for a
// zero handle).
func (e EventType[T]) Name() string {
	if e.def == nil {
		return ""
	}
	return e.def.qualified
}

// Version returns the current schema version.
func (e EventType[T]) Version() int {
	if e.def == nil {
		return 0
	}
	return e.def.version
}

// With pairs the event type with a payload, ready for [Tx.Append].
func (e EventType[T]) With(payload T) PendingEvent {
	return PendingEvent{def: e.def, payload: payload}
}

// Decode returns the typed event when env is of this type (upcast to the
// current version), and false when it is of another type.
func (e EventType[T]) Decode(env Envelope) (Event[T], bool, error) {
	if e.def == nil || env.Type != e.def.qualified {
		return Event[T]{}, false, nil
	}
	ev, err := decodeEvent[T](e.def, env)
	return ev, err == nil, err
}

// PendingEvent is an event type with its payload, not yet appended.
type PendingEvent struct {
	def     *eventDef
	payload any
}

// Type returns the qualified event type ("" when the handle was never
// declared).
func (p PendingEvent) Type() string {
	if p.def == nil {
		return ""
	}
	return p.def.qualified
}

// Envelope is a stored event with its payload still as JSON.
type Envelope = eventstore.Record

// Metadata is the metadata stored with every event.
type Metadata = eventstore.Metadata

// Cursor is a place in the log's delivery order.
type Cursor = eventstore.Cursor

// Stream names an aggregate stream within the caller's tenant: Type is the
// aggregate type ("order"), ID the aggregate's id.
type Stream struct {
	// Type is the aggregate type.
	Type string
	// ID is the aggregate's id within its type.
	ID string
}

// String renders "type/id".
func (s Stream) String() string { return s.Type + "/" + s.ID }

// Event is a stored event with its typed payload.
type Event[T any] struct {
	// ID is the event's position, its public id.
	ID int64
	// Cursor is the event's place in delivery order.
	Cursor Cursor
	// TenantID owns the event.
	TenantID string
	// Stream is the aggregate stream.
	Stream Stream
	// Version is the event's version within its stream (1-based).
	Version int64
	// Type is the qualified event type.
	Type string
	// Payload is the decoded (and upcast) payload.
	Payload T
	// Metadata carries user, request, correlation and causation ids.
	Metadata Metadata
	// CreatedAt is when the event was appended.
	CreatedAt time.Time
}

// upcast lifts a stored payload to the definition's current version. An
// upcaster's error, panic or output that is not JSON is returned as an
// error naming the event's type, position and the version it failed on: a
// panic must not take down a reader that has no one above it to recover
// (the SSE fan-out), and every reader reports which stored event it could
// not read.
func (d *eventDef) upcast(env Envelope) (json.RawMessage, error) {
	payload := env.Payload
	if env.TypeVersion > d.version {
		return nil, fmt.Errorf("kumiko: event %s at %d: stored at version %d, this code declares version %d: %w (a newer release wrote it)",
			d.qualified, env.Position, env.TypeVersion, d.version, ErrNewerEventVersion)
	}
	for v := max(env.TypeVersion, 1); v < d.version; v++ {
		up := d.upcasters[v]
		if up == nil {
			return nil, fmt.Errorf("kumiko: event %s at %d: no upcaster from version %d", d.qualified, env.Position, v)
		}
		var err error
		if payload, err = runUpcaster(up, payload); err != nil {
			return nil, fmt.Errorf("kumiko: event %s at %d: upcast from version %d: %w", d.qualified, env.Position, v, err)
		}
		// Stored payloads are JSON (jsonb); an upcaster's output need not
		// be. Refused here, or the SSE stream would send it as a string.
		if !json.Valid(payload) {
			return nil, fmt.Errorf("kumiko: event %s at %d: upcast from version %d: the upcaster returned no valid JSON", d.qualified, env.Position, v)
		}
	}
	return payload, nil
}

// runUpcaster calls up, with a panic turned into an error that names where
// it panicked: recovering here drops the stack that the dispatcher's and
// the HTTP server's own recovery would have logged.
func runUpcaster(up Upcaster, payload json.RawMessage) (out json.RawMessage, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("upcaster panicked%s: %v", panicSite(), v)
		}
	}()
	return up(payload)
}

// panicSite returns " at function (file.go:line)" of the code that
// panicked, for a deferred function that recovered the panic; "" when the
// stack does not show it.
func panicSite() string {
	var pcs [64]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs[:])])
	panicking := false
	for {
		f, more := frames.Next()
		switch {
		case f.Function == "runtime.gopanic":
			panicking = true
		case panicking && !strings.HasPrefix(f.Function, "runtime."):
			// The first frame below the runtime's panic machinery
			// (gopanic, and sigpanic or panicIndex and the like).
			return fmt.Sprintf(" at %s (%s:%d)", f.Function, filepath.Base(f.File), f.Line)
		}
		if !more {
			return ""
		}
	}
}

func decodeEvent[T any](d *eventDef, env Envelope) (Event[T], error) {
	payload, err := d.upcast(env)
	if err != nil {
		return Event[T]{}, err
	}
	var p T
	if err := json.Unmarshal(payload, &p); err != nil {
		return Event[T]{}, fmt.Errorf("kumiko: event %s at %d: decode payload: %w", d.qualified, env.Position, err)
	}
	return Event[T]{
		ID:        env.Position,
		Cursor:    env.Cursor(),
		TenantID:  env.TenantID,
		Stream:    Stream{Type: env.StreamType, ID: env.StreamID},
		Version:   env.Version,
		Type:      env.Type,
		Payload:   p,
		Metadata:  env.Metadata,
		CreatedAt: env.CreatedAt,
	}, nil
}

// UpcastPayload returns env's payload lifted to the current version of its
// declared type (unchanged for undeclared types). SSE and other generic
// readers use it. A panic of an upcaster is returned as an error: these
// readers run outside the recovery of handlers and consumers (the SSE hub's
// fan-out goroutine), where it would end the process.
func (r *Registry) UpcastPayload(env Envelope) (json.RawMessage, error) {
	d := r.events[env.Type]
	if d == nil {
		return env.Payload, nil
	}
	return d.upcast(env)
}

// IsPubSub reports whether the event type was declared with PubSub.
func (r *Registry) IsPubSub(qualified string) bool {
	d := r.events[qualified]
	return d != nil && d.pubSub
}
