package framework

import (
	"bytes"
	"context"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// WriteHandler handles one write command in its tenant-scoped transaction.
// Returning an error rolls the whole transaction back.
type WriteHandler[In, Out any] func(ctx context.Context, tx *Tx, in In) (Out, error)

// QueryHandler answers one query in a read-only tenant-scoped transaction.
type QueryHandler[In, Out any] func(ctx context.Context, tx *Tx, in In) (Out, error)

// WriteOptions tune [Write]. A nil *WriteOptions means the defaults.
type WriteOptions[In, Out any] struct {
	// Roles the caller must all have (403 access_denied otherwise).
	// Defaults to none.
	Roles []string
	// Validate runs after the payload's validator tags passed, in the
	// transaction, before PreSave. Return a *ValidationError to reject.
	Validate func(ctx context.Context, tx *Tx, in In) error
	// PreSave runs in the transaction right before the handler.
	PreSave func(ctx context.Context, tx *Tx, in In) error
	// PostSave runs in the transaction after the handler, once its events
	// are written and the inline projections have run. An error rolls back.
	PostSave func(ctx context.Context, tx *Tx, in In, out Out) error
	// AfterCommit runs after the transaction committed (not for a rolled
	// back batch). It cannot undo the write; errors are its own to handle,
	// and a panic is logged ([RuntimeConfig].Logger) and does not fail the
	// write.
	AfterCommit func(ctx context.Context, in In, out Out)
}

// QueryOptions tune [Query]. A nil *QueryOptions means the defaults.
type QueryOptions struct {
	// Roles the caller must all have (403 access_denied otherwise).
	// Defaults to none.
	Roles []string
	// Cache declares the query a cached single-entity read ([CacheBy]).
	// Defaults to nil: every call reads the database.
	Cache *QueryCache
}

// writeDef is the erased write handler.
type writeDef struct {
	qualified string
	roles     []string
	hasPost   bool
	// run decodes and validates the payload and runs hooks and handler. It
	// returns the result and a function for the after-commit hook (or nil).
	run func(ctx context.Context, tx *Tx, payload json.RawMessage) (any, func(context.Context), error)
	// post runs PostSave for a result produced by run.
	post func(ctx context.Context, tx *Tx, payload json.RawMessage, out any) error
}

// queryDef is the erased query handler.
type queryDef struct {
	qualified string
	roles     []string
	// decode decodes and validates a payload into the query's input (an
	// In), before any connection is taken.
	decode func(payload json.RawMessage) (any, error)
	// run runs the handler on a decoded input.
	run   func(ctx context.Context, tx *Tx, in any) (any, error)
	cache *cachedQuery
}

// Write registers the write handler "<feature>:write:<name>". In is the
// payload type (a struct with validator tags); Out is returned to the client
// as {"data": Out}.
func Write[In, Out any](f *Feature, name string, h WriteHandler[In, Out], opts *WriteOptions[In, Out]) {
	if opts == nil {
		opts = &WriteOptions[In, Out]{}
	}
	q := f.qualify("write", name)
	if h == nil {
		f.reg.problem("write %s has a nil handler", q)
	}
	def := &writeDef{qualified: q, roles: opts.Roles, hasPost: opts.PostSave != nil}
	def.run = func(ctx context.Context, tx *Tx, payload json.RawMessage) (any, func(context.Context), error) {
		var in In
		if err := DecodePayload(payload, &in); err != nil {
			return nil, nil, err
		}
		if opts.Validate != nil {
			if err := opts.Validate(ctx, tx, in); err != nil {
				return nil, nil, err
			}
		}
		if opts.PreSave != nil {
			if err := opts.PreSave(ctx, tx, in); err != nil {
				return nil, nil, err
			}
		}
		out, err := h(ctx, tx, in)
		if err != nil {
			return nil, nil, err
		}
		var after func(context.Context)
		if opts.AfterCommit != nil {
			after = func(ctx context.Context) { opts.AfterCommit(ctx, in, out) }
		}
		return out, after, nil
	}
	if opts.PostSave != nil {
		def.post = func(ctx context.Context, tx *Tx, payload json.RawMessage, out any) error {
			var in In
			if err := DecodePayload(payload, &in); err != nil {
				return err
			}
			o, _ := out.(Out)
			return opts.PostSave(ctx, tx, in, o)
		}
	}
	r := f.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.writes[q]; dup {
		r.problemLocked("write %s registered twice", q)
		return
	}
	r.writes[q] = def
}

// Query registers the query handler "<feature>:query:<name>". Its answer is
// returned to the client as {"data": Out}.
func Query[In, Out any](f *Feature, name string, h QueryHandler[In, Out], opts *QueryOptions) {
	if opts == nil {
		opts = &QueryOptions{}
	}
	q := f.qualify("query", name)
	if h == nil {
		f.reg.problem("query %s has a nil handler", q)
	}
	def := &queryDef{qualified: q, roles: opts.Roles}
	if opts.Cache != nil {
		def.cache = bindCache[In, Out](f, q, opts.Cache)
	}
	def.decode = func(payload json.RawMessage) (any, error) {
		var in In
		if err := DecodePayload(payload, &in); err != nil {
			return nil, err
		}
		return in, nil
	}
	def.run = func(ctx context.Context, tx *Tx, in any) (any, error) {
		// Not in.(In): an interface In (any) decodes an absent or null
		// payload to the nil interface, which that assertion panics on.
		v, _ := in.(In)
		return h(ctx, tx, v)
	}
	r := f.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.queries[q]; dup {
		r.problemLocked("query %s registered twice", q)
		return
	}
	r.queries[q] = def
}

// DecodePayload decodes a JSON payload into v strictly (unknown fields and
// wrong types are field errors) and checks v's validator tags. Every failure
// is a *[ValidationError]. An absent or null payload decodes as the zero value.
func DecodePayload(payload json.RawMessage, v any) error {
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) > 0 && !bytes.Equal(trimmed, []byte("null")) {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			return decodeError(trimmed, v, err)
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return &ValidationError{Fields: []FieldError{{Field: "", Rule: "json", Message: "payload has trailing data"}}}
		}
	}
	return ValidatePayload(v)
}

// maxLocatedPayload bounds the payloads whose decode error is placed by
// walking them again ([locateDecodeError]): the walk decodes each value
// once per level it is nested in, about 0.6 s of CPU for a bad 1 MiB
// payload, where a larger one falls back to encoding/json's own path.
const maxLocatedPayload = 64 << 10

// decodeError turns the encoding/json error of decoding payload into v into
// a field error named by its JSON path ([locateDecodeError]); an error it
// cannot place (malformed JSON) is the payload's.
func decodeError(payload []byte, v any, err error) error {
	var se *json.SyntaxError
	if t := reflect.TypeOf(v); t != nil && len(payload) <= maxLocatedPayload && !errors.As(err, &se) && !errors.Is(err, io.ErrUnexpectedEOF) {
		if fe := locateDecodeError(payload, t, false, ""); fe != nil {
			return &ValidationError{Fields: []FieldError{*fe}}
		}
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return &ValidationError{Fields: []FieldError{*typeFieldError(te.Field, te)}}
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		field := strings.Trim(rest, `"`)
		return &ValidationError{Fields: []FieldError{{Field: field, Rule: "unknown", Message: fmt.Sprintf("unknown field %q", field)}}}
	}
	return &ValidationError{Fields: []FieldError{{Field: "", Rule: "json", Message: "payload is not valid: " + strings.TrimPrefix(msg, "json: ")}}}
}

// jsonKind names the JSON kind a value of Go type t decodes from, by its
// kind rather than its name (a named string type takes a string, a
// time.Duration an integer); a type that decodes itself from text only
// (uuid.UUID, netip.Addr) takes a string; a json.Number a number.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == jsonNumberType {
		return "number" // a string kind, but it takes a JSON number
	}
	if !reflect.PointerTo(t).Implements(jsonUnmarshalerType) && reflect.PointerTo(t).Implements(textUnmarshalerType) {
		return "string"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "string" // []byte is base64 text
		}
		return "array"
	case reflect.Array:
		return "array"
	default:
		return "object"
	}
}

var (
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
	jsonNumberType      = reflect.TypeFor[json.Number]()
)

// intRange returns the bounds of an integer type t.
func intRange(t reflect.Type) (lo, hi string, ok bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	bits := t.Bits
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n := bits()
		return strconv.FormatInt(-1<<(n-1), 10), strconv.FormatInt(1<<(n-1)-1, 10), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "0", strconv.FormatUint(1<<bits()-1, 10), true
	}
	return "", "", false
}
