package jobs

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/kumiko-go/kumiko/framework"
)

// namePattern is kebab-case, the framework's rule for every name.
var namePattern = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)

// Trigger says what starts a job.
type Trigger string

const (
	// TriggerEvent jobs run once per committed event of their type.
	TriggerEvent Trigger = "event"
	// TriggerCron jobs run once per tick of their schedule.
	TriggerCron Trigger = "cron"
	// TriggerManual jobs run when dispatched ([Client.Dispatch],
	// [DispatchTx]).
	TriggerManual Trigger = "manual"
)

// Priority weights a job against the others of its lane.
type Priority string

const (
	// PriorityLow jobs get a tenth of the lane's pulls while others wait.
	PriorityLow Priority = "low"
	// PriorityDefault is the default priority.
	PriorityDefault Priority = "default"
	// PriorityHigh jobs get six tenths of the lane's pulls while others wait.
	PriorityHigh Priority = "high"
)

// Lanes lists the two job lanes.
var Lanes = []framework.RunIn{framework.RunInAPI, framework.RunInWorker}

// Options tune a job. A nil *Options means the defaults.
type Options struct {
	// RunIn is the lane: framework.RunInWorker (worker and all-in-one
	// processes) or framework.RunInAPI (api processes with RunLocalJobs,
	// and all-in-one). framework.RunInBoth is refused at registration: a
	// job has one lane. Defaults to framework.RunInWorker.
	RunIn framework.RunIn
	// MaxRetries is how often a failed run is retried before the job is
	// archived; a negative value means never. Defaults to 10.
	MaxRetries int
	// Backoff returns the delay before the retry that follows the
	// attempt-th failed run (attempt starts at 1). The retry is due at the
	// first whole second at or after it (asynq keeps due times in
	// seconds). Defaults to [DefaultBackoff].
	Backoff func(attempt int) time.Duration
	// Timeout bounds one run; the run's context ends when it passes and the
	// run counts as failed. A handler that has not returned a second
	// later is abandoned (left running in its goroutine); its
	// [Context.InTx] transactions roll back and fail from then on, whatever
	// context they are given. Defaults to 30 minutes.
	Timeout time.Duration
	// Unique, when at least one second, makes an enqueue a no-op while
	// another run of the same job with the same payload and tenant is
	// waiting or running, for at most this window. Defaults to 0 (off).
	Unique time.Duration
	// Priority weights the job within its lane. Defaults to
	// PriorityDefault.
	Priority Priority
	// Location is the time zone of a cron job's schedule (ignored by other
	// triggers; a CRON_TZ= prefix in the spec wins). Defaults to UTC.
	Location *time.Location
}

// DefaultBackoff is the default retry delay: 1s doubling per failed run,
// capped at 10 minutes, with ±20% jitter.
func DefaultBackoff(attempt int) time.Duration {
	d := time.Second
	for i := 1; i < attempt && d < 10*time.Minute; i++ {
		d *= 2
	}
	d = min(d, 10*time.Minute)
	return d*8/10 + time.Duration(rand.Int64N(int64(d*4/10)+1))
}

// Handler runs one job: in is the triggering event ([OnEvent]), the tick
// ([Cron]) or the dispatched payload ([Manual]). Returning an error fails
// the run, which is retried per the job's options; wrap [SkipRetry] to
// archive it at once.
type Handler[In any] func(ctx context.Context, jc *Context, in In) error

// Tick is the input of a cron job.
type Tick struct {
	// Time is the tick the run belongs to (in the job's time zone), not the
	// time it started.
	Time time.Time
}

// Job is a registered job's definition.
type Job struct {
	name    string
	feature string
	trigger Trigger
	event   string
	spec    string
	sched   schedule
	// zone is the time zone a cron job's schedule ticks in: its
	// CRON_TZ= prefix's, else opts.Location.
	zone *time.Location
	opts Options
	// run decodes the task's payload (setting jc.TenantID) and calls the
	// typed handler. A payload it cannot decode is an error wrapping
	// errUndecodable.
	run func(ctx context.Context, jc *Context, payload []byte) error
	// check validates a manual payload before it is enqueued and returns
	// its JSON, nil for none (the zero input).
	check func(payload any) (json.RawMessage, error)
}

// Name returns the qualified name "<feature>:job:<name>", the asynq task
// type. It is a persistent identifier: never rename a job that has shipped.
func (j *Job) Name() string { return j.name }

// Trigger returns what starts the job.
func (j *Job) Trigger() Trigger { return j.trigger }

// Event returns the triggering event type of an event job ("" otherwise).
func (j *Job) Event() string { return j.event }

// Spec returns a cron job's schedule ("" otherwise).
func (j *Job) Spec() string { return j.spec }

// RunIn returns the job's lane.
func (j *Job) RunIn() framework.RunIn { return j.opts.RunIn }

// Options returns the job's options with defaults applied.
func (j *Job) Options() Options { return j.opts }

// maxRetry is the job's retry limit ([Options].MaxRetries; 0 for none).
func (j *Job) maxRetry() int { return max(j.opts.MaxRetries, 0) }

// crashReserve is how many attempts a job's tasks carry beyond the job's
// retry limit, for a worker that dies during a run. asynq archives a run
// whose lease ran out (its worker was killed) when its retries are used
// up, so a worker dying during the last allowed attempt would lose the
// run. The runner archives a run that fails its last allowed attempt
// itself (see [lastAttempt]), so the reserve is used only by a dead
// worker's run.
const crashReserve = 1

// asynqMaxRetry is the retry count a job's tasks carry: the job's limit
// plus [crashReserve].
func (j *Job) asynqMaxRetry() int { return j.maxRetry() + crashReserve }

// lastAttempt is the error of a run that failed its last allowed attempt:
// it reads as the handler's error and matches [SkipRetry], so that asynq
// archives the run instead of spending the attempt kept for a dead worker.
type lastAttempt struct{ error }

// Is makes a lastAttempt match SkipRetry.
func (e lastAttempt) Is(target error) bool { return target == SkipRetry }

// Unwrap returns the handler's error.
func (e lastAttempt) Unwrap() error { return e.error }

// Set is the side table of a registry's jobs; get it with [For].
type Set struct {
	reg        *framework.Registry
	mu         sync.Mutex
	jobs       map[string]*Job
	byEvent    map[string][]*Job
	dispatched framework.EventType[Dispatched]
	declared   bool
}

type setKey struct{}

// For returns the job set of reg, creating it on first use.
func For(reg *framework.Registry) *Set {
	return reg.Extension(setKey{}, func() any {
		return &Set{reg: reg, jobs: map[string]*Job{}, byEvent: map[string][]*Job{}}
	}).(*Set)
}

// Jobs returns every registered job, sorted by name.
func (s *Set) Jobs() []*Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Job, 0, len(s.jobs))
	for _, j := range s.jobs {
		out = append(out, j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
	return out
}

// Job returns the job of this qualified name, or nil.
func (s *Set) Job(name string) *Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs[name]
}

// Len returns the number of registered jobs.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.jobs)
}

// InLane returns the jobs of one lane, sorted by name.
func (s *Set) InLane(lane framework.RunIn) []*Job {
	var out []*Job
	for _, j := range s.Jobs() {
		if j.opts.RunIn == lane {
			out = append(out, j)
		}
	}
	return out
}

// TriggerTypes returns the event types the job-trigger consumer reads: every
// type some job is triggered by, and the transactional dispatch event.
func (s *Set) TriggerTypes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.byEvent)+1)
	for t := range s.byEvent {
		out = append(out, t)
	}
	if s.declared {
		out = append(out, s.dispatched.Name())
	}
	sort.Strings(out)
	return out
}

// forEvent returns the jobs an event type triggers.
func (s *Set) forEvent(typ string) []*Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byEvent[typ]
}

// dispatchedType returns the qualified type of the transactional dispatch
// event ("" before any job was registered).
func (s *Set) dispatchedType() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.declared {
		return ""
	}
	return s.dispatched.Name()
}

func (s *Set) problem(format string, args ...any) {
	s.reg.AddProblem(fmt.Errorf("kumiko: "+format, args...))
}

// register checks and adds a job; mistakes become registry problems.
func (s *Set) register(f *framework.Feature, name string, trigger Trigger, opts *Options, j *Job) *Job {
	// Like every registration, a job registered after Registry.Build panics
	// (Feature checks that the registry is still open).
	s.reg.Feature(f.Name())
	var o Options
	if opts != nil {
		o = *opts
	}
	j.feature = f.Name()
	j.name = f.Name() + ":job:" + name
	j.trigger = trigger
	if !namePattern.MatchString(name) {
		s.problem("job name %q of feature %q is not kebab-case", name, f.Name())
	}
	o.RunIn = cmp.Or(o.RunIn, framework.RunInWorker)
	switch o.RunIn {
	case framework.RunInWorker, framework.RunInAPI:
	case framework.RunInBoth:
		s.problem("job %s: runIn both is not allowed: a job runs in exactly one lane, choose api or worker", j.name)
	default:
		s.problem("job %s: runIn %q is not api or worker", j.name, o.RunIn)
	}
	switch {
	case o.MaxRetries == 0:
		o.MaxRetries = 10
	case o.MaxRetries < 0:
		o.MaxRetries = 0
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	o.Timeout = cmp.Or(o.Timeout, 30*time.Minute)
	if o.Timeout < 0 {
		s.problem("job %s: timeout %s is negative", j.name, o.Timeout)
	}
	if o.Unique != 0 && o.Unique < time.Second {
		s.problem("job %s: unique window %s is shorter than one second", j.name, o.Unique)
	}
	o.Priority = cmp.Or(o.Priority, PriorityDefault)
	switch o.Priority {
	case PriorityLow, PriorityDefault, PriorityHigh:
	default:
		s.problem("job %s: priority %q is not low, default or high", j.name, o.Priority)
	}
	if o.Location == nil {
		o.Location = time.UTC
	}
	j.opts = o

	// The registry's lock and the set's are never taken in the other order
	// (the registry never calls into the set), so holding s.mu while
	// declaring the event and recording problems is safe.
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.declared {
		// The transactional dispatch event is declared with the first job,
		// so that registries without jobs stay untouched. It is internal:
		// its payload is the job's input, which the tenant's SSE stream
		// must not show to every user.
		s.declared = true
		s.dispatched = framework.DefineEvent[Dispatched](s.reg.Feature(dispatchFeature), dispatchEvent,
			&framework.EventOptions{PubSub: true, Internal: true})
	}
	if _, dup := s.jobs[j.name]; dup {
		s.problem("job %s registered twice", j.name)
		return j
	}
	s.jobs[j.name] = j
	if j.event != "" {
		s.byEvent[j.event] = append(s.byEvent[j.event], j)
	}
	return j
}

// OnEvent registers the job "<feature>:job:<name>" that runs once for every
// committed event of type ev, with the typed event as input. It is enqueued
// by the shared system consumer system:consumer:job-trigger with a task id
// derived from the job and the event's position, so it is enqueued once
// however often that consumer re-reads the event. An undeclared event, a
// nil handler or invalid options are registration problems reported by
// [framework.Registry.Build].
func OnEvent[T any](f *framework.Feature, name string, ev framework.EventType[T], opts *Options, h Handler[framework.Event[T]]) *Job {
	s := For(f.Registry())
	j := &Job{event: ev.Name()}
	switch {
	case ev.Name() == "":
		s.problem("job %s:job:%s is triggered by an undeclared event (declare it with DefineEvent first)", f.Name(), name)
	case !f.Registry().HasEvent(ev.Name()):
		s.problem("job %s:job:%s is triggered by %s, which this registry never declared", f.Name(), name, ev.Name())
	}
	if h == nil {
		s.problem("job %s:job:%s has a nil handler", f.Name(), name)
	}
	j.run = func(ctx context.Context, jc *Context, payload []byte) error {
		w, err := decodeWire(payload)
		if err != nil {
			return fmt.Errorf("jobs: %s: %w (%w)", jc.Job, err, SkipRetry)
		}
		jc.TenantID = w.Tenant
		if w.Event == nil {
			return fmt.Errorf("jobs: %s: task carries no event: %w", jc.Job, SkipRetry)
		}
		e, ok, err := ev.Decode(w.Event.envelope(jc.TenantID))
		if errors.Is(err, framework.ErrNewerEventVersion) {
			// A newer release wrote the event; its workers can run the job,
			// so retry rather than archive while the deploy completes.
			return fmt.Errorf("jobs: %s: decode event %d: %w", jc.Job, w.Event.Position, err)
		}
		if err != nil {
			return fmt.Errorf("jobs: %s: decode event %d: %w (%w)", jc.Job, w.Event.Position, err, SkipRetry)
		}
		if !ok {
			return fmt.Errorf("jobs: %s: task carries a %s event, want %s: %w", jc.Job, w.Event.Type, ev.Name(), SkipRetry)
		}
		return h(ctx, jc, e)
	}
	return s.register(f, name, TriggerEvent, opts, j)
}

// Cron registers the job "<feature>:job:<name>" that runs once per tick of
// spec: a five-field cron expression ("0 3 * * *"), a descriptor
// ("@hourly", "@daily"), or "@every <duration>" (at least one second; ticks
// are aligned to multiples of the duration since the Unix epoch). The time
// zone is opts.Location, or a "CRON_TZ=<zone> " prefix. Where the zone
// changes its offset (daylight saving time), a spec at fixed times of day
// (neither the minute nor the hour field a wildcard, or a descriptor from
// @daily up) behaves like Vixie cron's: a time the clock skips ticks when
// it jumps (a daily "30 2 * * *" in Europe/Berlin at 03:00 on the
// spring-forward day), and a time it repeats ticks once, the first time;
// other specs, @hourly and @every tick on real time. Every worker process
// runs the scheduler; each tick is enqueued with a task id derived from the
// job and the tick's time, so the job runs once per tick however many
// workers there are. An invalid spec is a registration problem.
func Cron(f *framework.Feature, name, spec string, opts *Options, h Handler[Tick]) *Job {
	s := For(f.Registry())
	j := &Job{spec: spec}
	loc := time.UTC
	if opts != nil && opts.Location != nil {
		loc = opts.Location
	}
	sched, zone, err := parseSchedule(spec, loc)
	if err != nil {
		s.problem("job %s:job:%s: cron spec %q: %v", f.Name(), name, spec, err)
	}
	j.sched, j.zone = sched, cmp.Or(zone, loc)
	if h == nil {
		s.problem("job %s:job:%s has a nil handler", f.Name(), name)
	}
	j.run = func(ctx context.Context, jc *Context, payload []byte) error {
		w, err := decodeWire(payload)
		if err != nil {
			return fmt.Errorf("jobs: %s: %w (%w)", jc.Job, err, SkipRetry)
		}
		jc.TenantID = w.Tenant
		return h(ctx, jc, Tick{Time: time.Unix(w.Tick, w.TickNanos).In(j.zone)})
	}
	return s.register(f, name, TriggerCron, opts, j)
}

// ManualJob is the typed handle of a manual job; keep it in a variable and
// dispatch with it.
type ManualJob[T any] struct {
	job *Job
	set *Set
}

// Manual registers the job "<feature>:job:<name>" that runs when it is
// dispatched, with a payload of type T (a struct with validator tags). A nil
// handler or invalid options are registration problems.
func Manual[T any](f *framework.Feature, name string, opts *Options, h Handler[T]) ManualJob[T] {
	s := For(f.Registry())
	j := &Job{}
	if h == nil {
		s.problem("job %s:job:%s has a nil handler", f.Name(), name)
	}
	j.check = func(payload any) (json.RawMessage, error) {
		switch p := payload.(type) {
		case T:
			// Typed: its validator tags are all there is to check.
			if err := framework.ValidatePayload(p); err != nil {
				return nil, err
			}
			return marshal(j.name, p)
		case *T:
			if p != nil {
				if err := framework.ValidatePayload(*p); err != nil {
					return nil, err
				}
				return marshal(j.name, *p)
			}
		}
		raw, ok := payload.(json.RawMessage)
		if !ok {
			var err error
			if raw, err = marshal(j.name, payload); err != nil {
				return nil, err
			}
		}
		// Anything else goes through JSON like an HTTP payload: unknown
		// fields and wrong types are field errors.
		var in T
		if err := framework.DecodePayload(raw, &in); err != nil {
			return nil, err
		}
		// DecodePayload takes a blank payload for the zero input, but the
		// task embeds the bytes as they are: whitespace around a value is
		// dropped, and a blank payload becomes no payload (the zero input),
		// so that the task is always valid JSON.
		if raw = bytes.TrimSpace(raw); len(raw) == 0 {
			return nil, nil
		}
		return raw, nil
	}
	j.run = func(ctx context.Context, jc *Context, payload []byte) error {
		// One pass over the task: the tenant and the typed input. Unknown
		// fields are ignored here (a newer build may have added one during
		// a rolling deploy); the validator tags still hold.
		var w struct {
			Tenant  string `json:"tenant"`
			Payload T      `json:"payload"`
		}
		if err := json.Unmarshal(payload, &w); err != nil || w.Tenant == "" {
			return fmt.Errorf("jobs: %s: decode task payload: %v (%w)", jc.Job, err, SkipRetry)
		}
		jc.TenantID = w.Tenant
		if err := framework.ValidatePayload(w.Payload); err != nil {
			return fmt.Errorf("jobs: %s: payload: %w (%w)", jc.Job, err, SkipRetry)
		}
		return h(ctx, jc, w.Payload)
	}
	return ManualJob[T]{job: s.register(f, name, TriggerManual, opts, j), set: s}
}

// Name returns the job's qualified name ("" for a zero handle).
func (m ManualJob[T]) Name() string {
	if m.job == nil {
		return ""
	}
	return m.job.name
}

// Dispatch enqueues the job with payload through c (directly to Redis). See
// [Client.Dispatch].
func (m ManualJob[T]) Dispatch(ctx context.Context, c *Client, payload T, opts *DispatchOptions) (string, error) {
	return c.Dispatch(ctx, m.Name(), payload, opts)
}

// DispatchFrom enqueues the job with payload from inside the running job
// jc, carrying its tenant and ids: a retried run of jc does not dispatch
// it twice. See [Context.Dispatch].
func (m ManualJob[T]) DispatchFrom(ctx context.Context, jc *Context, payload T, opts *DispatchOptions) (string, error) {
	return jc.Dispatch(ctx, m.Name(), payload, opts)
}

// DispatchTx enqueues the job with payload as part of tx. See [DispatchTx].
func (m ManualJob[T]) DispatchTx(ctx context.Context, tx *framework.Tx, payload T, opts *DispatchOptions) error {
	if m.set == nil {
		return fmt.Errorf("jobs: dispatch of a zero job handle")
	}
	return m.set.DispatchTx(ctx, tx, m.Name(), payload, opts)
}

func marshal(job string, v any) (json.RawMessage, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("jobs: %s: encode payload: %w", job, err)
	}
	return b, nil
}
