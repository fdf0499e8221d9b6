package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
)

// The transactional dispatch event, "jobs:event:dispatched".
const (
	dispatchFeature = "jobs"
	dispatchEvent   = "dispatched"
	// dispatchStream is the stream type of dispatch events; each dispatch
	// is its own stream, so concurrent dispatches never contend.
	dispatchStream = "job-dispatch"
)

// Dispatched is the payload of jobs:event:dispatched, the event
// [Set.DispatchTx] appends in the caller's transaction; the job-trigger
// consumer enqueues the job when it reads it.
type Dispatched struct {
	// Job is the qualified job name.
	Job string `json:"job" validate:"required"`
	// Payload is the job's input.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Key deduplicates the dispatch (see [DispatchOptions.Key]).
	Key string `json:"key,omitempty"`
}

// SkipRetry archives the run at once instead of retrying it when a
// handler's error wraps it.
var SkipRetry = asynq.SkipRetry

// ErrDuplicate is returned by [Client.Dispatch] when the run was not
// enqueued because an equal one exists: the same Key within the dedup
// window, or the same payload within the job's Unique window. The job runs
// once; callers usually treat it as success.
var ErrDuplicate = errors.New("jobs: duplicate dispatch")

// ErrUnknownJob is returned for a job name nobody registered, or one that
// is not a manual job.
var ErrUnknownJob = errors.New("jobs: unknown manual job")

// ErrInvalidTenantID is returned by [Client.Dispatch] (and
// [Context.Dispatch]) for a [DispatchOptions.TenantID] that no token could
// carry (see [auth.MaxIDLength]): longer than auth.MaxIDLength bytes,
// holding a NUL, or bytes that are not UTF-8. Such a run would fail at
// every attempt in the database, so nothing is enqueued.
var ErrInvalidTenantID = errors.New("jobs: invalid tenant id")

// checkTenantID refuses, with [ErrInvalidTenantID], a tenant id that auth
// would refuse in a token.
func checkTenantID(tenant string) error {
	switch {
	case len(tenant) > auth.MaxIDLength:
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidTenantID, len(tenant), auth.MaxIDLength)
	case strings.IndexByte(tenant, 0) >= 0:
		return fmt.Errorf("%w: it holds a NUL, which Postgres cannot store", ErrInvalidTenantID)
	case !utf8.ValidString(tenant):
		return fmt.Errorf("%w: it holds bytes that are not UTF-8", ErrInvalidTenantID)
	}
	return nil
}

// DispatchOptions tune a dispatch. A nil *DispatchOptions means the
// defaults.
type DispatchOptions struct {
	// TenantID owns the run and scopes its transactions ([Client.Dispatch]
	// only: [Set.DispatchTx] uses the transaction's tenant). At most
	// [auth.MaxIDLength] bytes of UTF-8 without a NUL, as in a token, else
	// the dispatch is [ErrInvalidTenantID]. Defaults to
	// framework.SystemTenantID.
	TenantID string
	// Key makes the dispatch idempotent: dispatches of the same job with
	// the same key in the same tenant run once within the dedup window of
	// the runner (24 hours by default). Defaults to "": every
	// [Client.Dispatch] runs, and a job's [Context.Dispatch] runs once per
	// run of the dispatching job however often that run is retried. A
	// taken key is [ErrDuplicate], except for a [Context.Dispatch] whose
	// own run (an earlier attempt of it) dispatched the key.
	Key string
	// CorrelationID is the run's correlation id ([Client.Dispatch] only;
	// [Set.DispatchTx] uses the transaction's). Defaults to the run's task
	// id.
	CorrelationID string
	// CausationID is the run's causation id ([Client.Dispatch] only;
	// [Set.DispatchTx] uses the dispatch event's id). Defaults to "".
	CausationID string
}

// EnqueueError is an enqueue that failed in Redis (unreachable, timed out,
// refused). It is transient: the job-trigger consumer retries it without
// counting the attempt, and its cursor waits.
type EnqueueError struct {
	// Job is the qualified job name.
	Job string
	// Err is asynq's error.
	Err error
}

// Error implements error.
func (e *EnqueueError) Error() string { return fmt.Sprintf("jobs: enqueue %s: %v", e.Job, e.Err) }

// Unwrap returns asynq's error.
func (e *EnqueueError) Unwrap() error { return e.Err }

// IsTransient reports whether err is (or wraps) an [*EnqueueError].
func IsTransient(err error) bool {
	var ee *EnqueueError
	return errors.As(err, &ee)
}

// Client enqueues jobs. It is safe for concurrent use; get it from
// [Runner.Client].
type Client struct {
	set       *Set
	aq        *asynq.Client
	in        *asynq.Inspector
	rdb       redis.UniversalClient
	prefix    string
	retention time.Duration
	timeout   time.Duration
	metrics   *metrics
	log       *slog.Logger
}

// Dispatch enqueues the manual job name with payload directly to Redis
// (not tied to a database transaction: use [Set.DispatchTx] for that) and
// returns the task id. The payload is checked against the job's input type
// first: a payload that does not decode or fails its validator tags is a
// *framework.ValidationError and nothing is enqueued. An unknown job is
// [ErrUnknownJob], a TenantID no token could carry [ErrInvalidTenantID];
// an equal run that already exists is [ErrDuplicate],
// returned with that run's id (the one holding the Unique window, or the
// key's run); an
// unreachable Redis is a framework.CodeUnavailable *framework.Error wrapping
// an [*EnqueueError]. Without a Key every call is a new run; from inside a
// job use [Context.Dispatch], which makes a retried run's dispatches
// duplicates of its earlier attempt's.
func (c *Client) Dispatch(ctx context.Context, name string, payload any, opts *DispatchOptions) (string, error) {
	return c.dispatch(ctx, name, payload, opts, "", "")
}

// dispatch is [Client.Dispatch] for [Context.Dispatch] when parent is not
// "": parent names the dispatching run (see parentRun), and childID, when
// opts has no Key, is the task id Context.Dispatch derived. A taken id is
// then no error when the taken task is this very dispatch, enqueued by an
// earlier attempt of the dispatching run: always for a derived childID,
// and for a Key when the task's headerParent names the run.
func (c *Client) dispatch(ctx context.Context, name string, payload any, opts *DispatchOptions, parent, childID string) (string, error) {
	if opts == nil {
		opts = &DispatchOptions{}
	}
	j, raw, err := c.set.checkManual(name, payload)
	if err != nil {
		return "", err
	}
	tenant := cmp.Or(opts.TenantID, framework.SystemTenantID)
	if err := checkTenantID(tenant); err != nil {
		return "", err
	}
	id, derived := name+"@"+uuid.Must(uuid.NewV7()).String(), false
	switch {
	case opts.Key != "":
		id, derived = keyTaskID(name, tenant, opts.Key), true
	case childID != "":
		id, derived = childID, true
	}
	// Without ids the run's correlation id is its task id (see the
	// handler); no headers keep the task small.
	hdr := map[string]string{headerCorrelation: opts.CorrelationID, headerCausation: opts.CausationID, headerParent: parent}
	dup, holder, err := c.enqueueRun(ctx, j, &wire{Tenant: tenant, Payload: raw}, id, hdr, derived)
	if err == nil && dup == takenID && opts.Key != "" && parent != "" {
		// Whose dispatch took the key: this run's earlier attempt's, or
		// another run's.
		var ours bool
		if ours, err = c.dispatchedBy(ctx, j, id, parent); err == nil && ours {
			return id, nil
		}
	}
	switch {
	case err != nil:
		return "", &framework.Error{Code: framework.CodeUnavailable, Message: "job queue unavailable", Err: err}
	case dup == takenID && opts.Key == "" && childID != "":
		return id, nil
	case dup == takenUnique:
		// Not id: a fresh one, never enqueued.
		return holder, fmt.Errorf("%w: %s holds the Unique window", ErrDuplicate, cmp.Or(holder, "an equal run"))
	case dup != takenNone:
		return id, fmt.Errorf("%w: %s", ErrDuplicate, id)
	}
	return id, nil
}

// dispatchedBy reports whether the existing task id of job j was
// dispatched by the run parent (its headerParent). A task gone meanwhile
// (its retention ended) is not; a Redis failure is an [*EnqueueError].
func (c *Client) dispatchedBy(ctx context.Context, j *Job, id, parent string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, &EnqueueError{Job: j.name, Err: err}
	}
	ti, err := c.in.GetTaskInfo(QueueName(c.prefix, j.opts.RunIn, j.opts.Priority), id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return false, nil
	case err != nil:
		return false, &EnqueueError{Job: j.name, Err: err}
	}
	return ti.Headers[headerParent] == parent, nil
}

// checkManual finds a manual job and checks a payload against its input.
func (s *Set) checkManual(name string, payload any) (*Job, json.RawMessage, error) {
	j := s.Job(name)
	if j == nil || j.trigger != TriggerManual {
		return nil, nil, fmt.Errorf("%w %q", ErrUnknownJob, name)
	}
	raw, err := j.check(payload)
	if err != nil {
		return nil, nil, err
	}
	return j, raw, nil
}

// DispatchTx enqueues the manual job name with payload as part of tx: it
// appends a jobs:event:dispatched event in tx, and the job-trigger consumer
// enqueues the job once the transaction has committed (and never when it
// rolls back). There is no dual write: the event log is the outbox. The run
// belongs to the transaction's tenant and carries its correlation id; its
// causation id is the dispatch event's id. The payload is checked first
// (*framework.ValidationError); an unknown job is [ErrUnknownJob].
func (s *Set) DispatchTx(ctx context.Context, tx *framework.Tx, name string, payload any, opts *DispatchOptions) error {
	_ = ctx
	if opts == nil {
		opts = &DispatchOptions{}
	}
	_, raw, err := s.checkManual(name, payload)
	if err != nil {
		return err
	}
	ev := s.dispatched
	stream := framework.Stream{Type: dispatchStream, ID: uuid.Must(uuid.NewV7()).String()}
	return tx.Append(stream, framework.NoStream, ev.With(Dispatched{Job: name, Payload: raw, Key: opts.Key}))
}

// asynqTimeout is the timeout a job's tasks carry: the job's Timeout plus
// twice [timeoutGrace], rounded up to whole seconds (asynq keeps it in
// whole seconds: it truncates, and reads 0 as its 30 minute default). The
// handler bounds the run by the job's exact Timeout itself and returns at
// most timeoutGrace after it, so its error reaches asynq before asynq's
// own deadline does. (asynq decides on its deadline without the
// handler's error: it would retry a run whose last allowed attempt timed
// out on the attempt kept for a dead worker, see crashReserve.)
func asynqTimeout(d time.Duration) time.Duration {
	d += 2 * timeoutGrace
	return (d + time.Second - 1) / time.Second * time.Second
}

// taken says why an enqueue added no run.
type taken int

const (
	// takenNone: the run was enqueued.
	takenNone taken = iota
	// takenID: a run with the task id exists (waiting, running, retained
	// after it finished, or archived): this very run was enqueued before.
	takenID
	// takenUnique: another run of the job with the same tenant and payload
	// holds the job's Unique window.
	takenUnique
)

// enqueue puts one run on its lane's queue under taskID. dup reports that
// nothing was added because the id or the job's Unique window was taken,
// and which; that is not an error: the run exists. Redis failures are
// *EnqueueError. dedup retains the completed run for the dedup window,
// keeping its id taken.
func (c *Client) enqueue(ctx context.Context, j *Job, w *wire, taskID string, headers map[string]string, dedup bool) (dup taken, err error) {
	dup, _, err = c.enqueueRun(ctx, j, w, taskID, headers, dedup)
	return dup, err
}

// enqueueRun is enqueue that also names the run that exists: taskID when
// the id was taken, the run holding the Unique window when that was (""
// when the window ended meanwhile or Redis did not answer).
func (c *Client) enqueueRun(ctx context.Context, j *Job, w *wire, taskID string, headers map[string]string, dedup bool) (dup taken, holder string, err error) {
	if dedup || j.opts.Unique > 0 {
		headers = maps.Clone(headers)
		if headers == nil {
			headers = map[string]string{}
		}
	}
	if dedup {
		// The id is derived and can be taken again by a later run once
		// asynq has dropped this one: the run id tells their children
		// apart (see childTaskID).
		headers[headerRun] = uuid.Must(uuid.NewV7()).String()
	}
	if j.opts.Unique > 0 {
		headers[headerUnique] = strconv.FormatInt(int64((j.opts.Unique+time.Second-1)/time.Second), 10)
	}
	task, err := newTask(j, w, headers)
	if err != nil {
		return takenNone, "", fmt.Errorf("jobs: %s: %w", j.name, err)
	}
	queue := QueueName(c.prefix, j.opts.RunIn, j.opts.Priority)
	opts := []asynq.Option{
		asynq.Queue(queue),
		asynq.MaxRetry(j.asynqMaxRetry()),
		asynq.Timeout(asynqTimeout(j.opts.Timeout)),
		asynq.TaskID(taskID),
	}
	if dedup {
		opts = append(opts, asynq.Retention(c.retention))
	}
	if j.opts.Unique > 0 {
		opts = append(opts, asynq.Unique(j.opts.Unique))
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if dedup && j.opts.Unique > 0 {
		// asynq takes a Unique job's lock before it checks the task id,
		// and keeps the lock when the id is taken: a second enqueue of a
		// trigger whose run has finished (a re-read of the job-trigger
		// consumer, a rewind, another worker's late tick) would hold the
		// lock for the whole window with no run behind it, and every equal
		// dispatch meanwhile would be dropped as a duplicate. A taken id
		// is a duplicate before the lock is touched.
		n, err := c.rdb.Exists(ctx, taskKey(queue, taskID)).Result()
		if err != nil {
			return takenNone, "", &EnqueueError{Job: j.name, Err: err}
		}
		if n > 0 {
			return takenID, taskID, nil
		}
	}
	_, err = c.aq.EnqueueContext(ctx, task, opts...)
	if errors.Is(err, asynq.ErrDuplicateTask) {
		// An archived run holds no window: a lock its handler never
		// freed (see releaseStaleUnique) is freed now, and the enqueue
		// tried once more.
		if freed, ferr := releaseStaleUnique(ctx, c.rdb, queue, uniqueKey(queue, task)); ferr == nil && freed {
			_, err = c.aq.EnqueueContext(ctx, task, opts...)
		}
	}
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return takenID, taskID, nil
	case errors.Is(err, asynq.ErrDuplicateTask):
		// The lock's value is the id of the run that holds it.
		holder, _ := c.rdb.Get(ctx, uniqueKey(queue, task)).Result()
		return takenUnique, holder, nil
	case err != nil:
		return takenNone, "", &EnqueueError{Job: j.name, Err: err}
	}
	c.metrics.enqueued.WithLabelValues(string(j.opts.RunIn), j.name).Inc()
	return takenNone, "", nil
}
