package framework

import (
	"cmp"
	"context"
	"fmt"
)

// Delivery says which processes a multi-stream projection's cursor belongs
// to.
type Delivery string

const (
	// DeliveryShared: one cursor for the whole deployment; each event is
	// applied once, by whichever process holds the consumer's lock.
	DeliveryShared Delivery = "shared"
	// DeliveryPerInstance: one cursor per process instance; every process
	// applies every event (for in-process state such as SSE hubs).
	DeliveryPerInstance Delivery = "per-instance"
)

// RunIn says which process kind runs a projection or job.
type RunIn string

const (
	// RunInWorker runs in worker (and all-in-one) processes.
	RunInWorker RunIn = "worker"
	// RunInAPI runs a job in the api lane (API processes with local jobs,
	// and all-in-one ones); a shared projection with it runs only in
	// all-in-one processes (see [ProjectionOptions].RunIn).
	RunInAPI RunIn = "api"
	// RunInBoth runs a shared projection in worker and all-in-one
	// processes (API processes run no shared consumers); jobs refuse it.
	RunInBoth RunIn = "both"
)

// ProjectionKind distinguishes inline from multi-stream projections.
type ProjectionKind string

const (
	// KindInline projections run in the transaction that appends their
	// events (a write, a job's InTx, a saga's dispatcher pass).
	KindInline ProjectionKind = "inline"
	// KindMultiStream projections run in dispatcher passes after commit.
	KindMultiStream ProjectionKind = "multi-stream"
)

// ProjectionOptions tune [MultiStreamProjection].
type ProjectionOptions struct {
	// Table the projection owns and fills (it can be rebuilt); "" for a
	// side-effect-only consumer. Defaults to "".
	Table string
	// Delivery is shared or per-instance. Defaults to DeliveryShared.
	Delivery Delivery
	// RunIn selects the process kind of a shared projection: worker and
	// both run it in worker and all-in-one processes, api only in
	// all-in-one ones (api processes run no shared consumers, ARCHITECTURE
	// §7; api and worker processes register its state row all the same, so
	// that a prune keeps its events and it can be disabled). A per-instance projection runs in every api and all-in-one
	// process whatever RunIn says. Defaults to RunInWorker.
	RunIn RunIn
	// SkipApplyErrors moves past a failing event (recording it as a dead
	// letter) instead of retrying it. Defaults to false (strict).
	SkipApplyErrors bool
	// MaxAttempts before the consumer turns dead. Defaults to 10 (when 0);
	// a negative one is a registration problem.
	MaxAttempts int
	// BatchSize is the number of events per pass; a negative one is a
	// registration problem. Defaults to the dispatcher's batch size.
	BatchSize int
	// Saga marks a projection that appends events; it cannot be rebuilt,
	// and per-instance delivery is a registration problem (every process
	// would append its events). Defaults to false.
	Saga bool
	// Partitions splits the consumer into that many state rows, each
	// reading the events of the streams that hash to it: passes of
	// different partitions run in parallel, and each stream's events still
	// arrive in order (events of different streams may not). 0 and 1 mean
	// one cursor; more than MaxPartitions, or a negative number, is a
	// registration problem. Defaults to 1.
	Partitions int
}

// MaxPartitions bounds [ProjectionOptions.Partitions]: every partition is a
// state row and a pass loop of its own.
const MaxPartitions = 64

// ApplyFunc is the erased form of a projection handler.
type ApplyFunc func(ctx context.Context, tx *Tx, env Envelope) error

// Projection is a registered projection: inline (in the write transaction)
// or multi-stream (in dispatcher passes). Add handlers with [On].
type Projection struct {
	reg      *Registry
	name     string
	kind     ProjectionKind
	opts     ProjectionOptions
	handlers map[string]ApplyFunc
	types    []string
	// ons counts the On calls, also refused ones (they report themselves).
	ons int
}

// MultiStreamProjection registers the consumer name ("<feature>:<name>" is
// its persistent id; never rename it). Its handlers run after commit in
// dispatcher passes, each pass in one transaction with the cursor.
func MultiStreamProjection(f *Feature, name string, opts *ProjectionOptions) *Projection {
	var o ProjectionOptions
	if opts != nil {
		o = *opts
	}
	o.Delivery = cmp.Or(o.Delivery, DeliveryShared)
	o.RunIn = cmp.Or(o.RunIn, RunInWorker)
	negativeAttempts := o.MaxAttempts < 0
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 10
	}
	p := registerProjection(f, name, KindMultiStream, o)
	if negativeAttempts {
		// Not silently the default: a negative limit is a mistake (0 is
		// "the default"), as a negative BatchSize is.
		f.reg.problem("projection %s: max attempts %d is negative", p.name, opts.MaxAttempts)
	}
	if o.Delivery != DeliveryShared && o.Delivery != DeliveryPerInstance {
		f.reg.problem("projection %s: delivery %q is not shared or per-instance", p.name, o.Delivery)
	}
	if o.Saga && o.Delivery == DeliveryPerInstance {
		// Every process applies every event with a cursor of its own.
		f.reg.problem("projection %s: a saga cannot have per-instance delivery: every process would append its events once", p.name)
	}
	if o.RunIn != RunInWorker && o.RunIn != RunInAPI && o.RunIn != RunInBoth {
		f.reg.problem("projection %s: runIn %q is not api, worker or both", p.name, o.RunIn)
	}
	if o.BatchSize < 0 {
		// A negative LIMIT would fail every pass of the consumer.
		f.reg.problem("projection %s: batch size %d is negative", p.name, o.BatchSize)
	}
	if o.Partitions < 0 || o.Partitions > MaxPartitions {
		f.reg.problem("projection %s: partitions %d is not between 1 and %d", p.name, o.Partitions, MaxPartitions)
	}
	return p
}

// InlineProjection registers a projection whose handlers run inside the
// transaction that appends the event, when the event is written (see
// [Tx.Flush]): a write's, a job's InTx's, or the dispatcher pass of a saga
// that appends it. Its failure rolls the write back, or fails the saga's
// event like an error of the saga's handler.
func InlineProjection(f *Feature, name string) *Projection {
	return registerProjection(f, name, KindInline, ProjectionOptions{})
}

func registerProjection(f *Feature, name string, kind ProjectionKind, o ProjectionOptions) *Projection {
	f.reg.mustBeOpen()
	if !namePattern.MatchString(name) {
		f.reg.problem("projection name %q of feature %q is not kebab-case", name, f.name)
	}
	p := &Projection{reg: f.reg, name: f.name + ":" + name, kind: kind, opts: o, handlers: map[string]ApplyFunc{}}
	r := f.reg
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.projections[p.name]; dup {
		r.problemLocked("projection %s registered twice", p.name)
	} else {
		r.projections[p.name] = p
	}
	return p
}

// On adds the handler of event type ev to projection p. Naming an event
// that this registry never declared, or a second handler for the same type,
// is a registration problem.
func On[T any](p *Projection, ev EventType[T], fn func(ctx context.Context, tx *Tx, e Event[T]) error) {
	p.reg.mustBeOpen()
	p.ons++
	if ev.def == nil || p.reg.events[ev.def.qualified] != ev.def {
		p.reg.problem("projection %s handles undeclared event %q", p.name, ev.Name())
		return
	}
	if fn == nil {
		p.reg.problem("projection %s: nil handler for %s", p.name, ev.def.qualified)
		return
	}
	if _, dup := p.handlers[ev.def.qualified]; dup {
		p.reg.problem("projection %s handles %s twice", p.name, ev.def.qualified)
		return
	}
	def := ev.def
	p.handlers[def.qualified] = func(ctx context.Context, tx *Tx, env Envelope) error {
		e, err := decodeEvent[T](def, env)
		if err != nil {
			return err
		}
		return fn(ctx, tx, e)
	}
	p.types = append(p.types, def.qualified)
}

// Name returns the projection's persistent name ("<feature>:<name>").
func (p *Projection) Name() string { return p.name }

// Kind returns inline or multi-stream.
func (p *Projection) Kind() ProjectionKind { return p.kind }

// Options returns the projection's options with defaults applied.
func (p *Projection) Options() ProjectionOptions { return p.opts }

// EventTypes lists the event types the projection handles.
func (p *Projection) EventTypes() []string { return append([]string(nil), p.types...) }

// Apply runs the projection's handler for env (nil when it has none).
func (p *Projection) Apply(ctx context.Context, tx *Tx, env Envelope) error {
	h := p.handlers[env.Type]
	if h == nil {
		return nil
	}
	if err := h(ctx, tx, env); err != nil {
		return fmt.Errorf("projection %s: %s at %d: %w", p.name, env.Type, env.Position, err)
	}
	return nil
}
