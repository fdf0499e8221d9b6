package framework

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
)

// namePattern is kebab-case: lowercase words of letters and digits joined by '-'.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)

// Registry collects the features of one application: their events, write
// and query handlers, hooks and projections. Registration never panics:
// every mistake (duplicate or invalid name, nil function, a handler naming
// an undeclared event) is recorded, and [Registry.Build] reports all of them
// at once, which fails the boot.
//
// Names are persistent identifiers (consumer cursors and stored events are
// keyed by them): never rename one that has shipped.
type Registry struct {
	mu          sync.Mutex
	features    map[string]*Feature
	events      map[string]*eventDef
	writes      map[string]*writeDef
	queries     map[string]*queryDef
	projections map[string]*Projection
	problems    []error
	built       bool
	// inline maps an event type to the inline projections that handle it
	// (sorted by name); Build fills it, [Tx.Flush] runs them.
	inline map[string][]*Projection
	// extensions are side tables of packages that extend the registry
	// (framework/jobs), keyed by a value of their own unexported type.
	extensions map[any]any
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{
		features:    map[string]*Feature{},
		events:      map[string]*eventDef{},
		writes:      map[string]*writeDef{},
		queries:     map[string]*queryDef{},
		projections: map[string]*Projection{},
	}
}

// Feature is one named feature; everything registered through it is
// qualified with its name ("<feature>:write:<name>").
type Feature struct {
	reg  *Registry
	name string
}

// Feature returns the feature called name (kebab-case), creating it on
// first use.
func (r *Registry) Feature(name string) *Feature {
	r.mustBeOpen()
	r.mu.Lock()
	defer r.mu.Unlock()
	if f, ok := r.features[name]; ok {
		return f
	}
	if !namePattern.MatchString(name) {
		r.problemLocked("feature name %q is not kebab-case", name)
	}
	f := &Feature{reg: r, name: name}
	r.features[name] = f
	return f
}

// Name returns the feature's name.
func (f *Feature) Name() string { return f.name }

// Registry returns the registry the feature belongs to.
func (f *Feature) Registry() *Registry { return f.reg }

// qualify builds "<feature>:<kind>:<name>" and records an invalid name.
func (f *Feature) qualify(kind, name string) string {
	f.reg.mustBeOpen()
	if !namePattern.MatchString(name) {
		f.reg.problem("%s name %q of feature %q is not kebab-case", kind, name, f.name)
	}
	return f.name + ":" + kind + ":" + name
}

// mustBeOpen panics when the registry was already built: a registration
// then could no longer be reported, and would race with the runtime's reads.
func (r *Registry) mustBeOpen() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.built {
		panic("kumiko: registration after Registry.Build")
	}
}

func (r *Registry) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problemLocked(format, args...)
}

func (r *Registry) problemLocked(format string, args ...any) {
	r.problems = append(r.problems, fmt.Errorf("kumiko: "+format, args...))
}

// Extension returns the value stored under key, creating it with init on
// first use. Packages that extend the registry (framework/jobs) keep their
// side tables here; key should be a value of an unexported type of theirs.
// init runs under the registry's lock and must not call the registry.
func (r *Registry) Extension(key any, init func() any) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, ok := r.extensions[key]; ok {
		return v
	}
	if r.extensions == nil {
		r.extensions = map[any]any{}
	}
	v := init()
	r.extensions[key] = v
	return v
}

// AddProblem records a registration problem found by a package that extends
// the registry; [Registry.Build] reports it with all the others. A nil err
// is ignored.
func (r *Registry) AddProblem(err error) {
	if err == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = append(r.problems, err)
}

// Build checks the registry and returns every registration problem at once
// (nil when there is none). After Build the registry is read-only. Calling
// it again only reports the problems again.
func (r *Registry) Build() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.built {
		r.built = true
		r.inline = map[string][]*Projection{}
		for _, name := range sortedKeys(r.projections) {
			p := r.projections[name]
			if p.kind == KindInline {
				for _, t := range p.types {
					r.inline[t] = append(r.inline[t], p)
				}
			}
			if p.kind == KindMultiStream && p.ons == 0 {
				// Its consumer would read every type (no types is all
				// of them to the dispatcher), pinning retention and
				// showing lag over the whole log, and apply nothing.
				r.problemLocked("projection %s handles no event: add its handlers with framework.On", p.name)
			}
		}
	}
	return errors.Join(r.problems...)
}

// EventTypes lists the qualified names of every declared event, sorted.
func (r *Registry) EventTypes() []string { return sortedKeys(r.events) }

// WriteTypes lists the qualified names of every write handler, sorted.
func (r *Registry) WriteTypes() []string { return sortedKeys(r.writes) }

// QueryTypes lists the qualified names of every query handler, sorted.
func (r *Registry) QueryTypes() []string { return sortedKeys(r.queries) }

// HasEvent reports whether an event type of this qualified name is declared.
func (r *Registry) HasEvent(qualified string) bool {
	_, ok := r.events[qualified]
	return ok
}

// InternalEvent reports whether the event type is declared with
// [EventOptions].Internal (false for an undeclared one): the live stream to
// browsers never sends it.
func (r *Registry) InternalEvent(qualified string) bool {
	d, ok := r.events[qualified]
	return ok && d.internal
}

// Projections returns every registered projection (inline and
// multi-stream), sorted by name.
func (r *Registry) Projections() []*Projection {
	out := make([]*Projection, 0, len(r.projections))
	for _, k := range sortedKeys(r.projections) {
		out = append(out, r.projections[k])
	}
	return out
}

// Projection returns the projection called name, or nil.
func (r *Registry) Projection(name string) *Projection { return r.projections[name] }

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// closestNames returns up to n known names that share the most with name,
// for "did you mean" hints.
func closestNames(name string, known []string, n int) []string {
	type scored struct {
		s     string
		score int
	}
	var all []scored
	parts := strings.FieldsFunc(name, func(r rune) bool { return r == ':' || r == '-' })
	for _, k := range known {
		sc := 0
		for _, part := range parts {
			if strings.Contains(k, part) {
				sc++
			}
		}
		all = append(all, scored{k, sc})
	}
	slices.SortStableFunc(all, func(a, b scored) int { return b.score - a.score })
	out := make([]string, 0, n)
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, all[i].s)
	}
	return out
}
