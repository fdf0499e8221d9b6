package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kumiko-go/kumiko/framework"
)

// State is a run's state in its queue.
type State string

// The states [Inspector.List] accepts.
const (
	StateArchived  State = "archived"
	StatePending   State = "pending"
	StateActive    State = "active"
	StateScheduled State = "scheduled"
	StateRetry     State = "retry"
	StateCompleted State = "completed"
)

// States lists every state [Inspector.List] accepts.
var States = []State{StateArchived, StatePending, StateActive, StateScheduled, StateRetry, StateCompleted}

// ErrTaskNotFound is returned for a task id that is not in the lane's
// queues.
var ErrTaskNotFound = errors.New("jobs: task not found")

// ErrNotRetryable is returned by [Inspector.Retry] for a run that is
// pending, active or completed.
var ErrNotRetryable = errors.New("jobs: only archived, retry and scheduled runs can be retried")

// TaskInfo describes one run in a queue.
type TaskInfo struct {
	// ID is the task id.
	ID string `json:"id"`
	// Job is the qualified job name.
	Job string `json:"job"`
	// Lane is the lane of the run's queue.
	Lane framework.RunIn `json:"lane"`
	// Queue is the asynq queue.
	Queue string `json:"queue"`
	// State is the run's state.
	State State `json:"state"`
	// TenantID owns the run.
	TenantID string `json:"tenantId"`
	// Retried counts the failed runs so far.
	Retried int `json:"retried"`
	// MaxRetry is the job's retry limit.
	MaxRetry int `json:"maxRetry"`
	// LastError is the last failure's error ("" when none).
	LastError string `json:"lastError,omitempty"`
	// LastFailedAt is when it last failed (zero when never).
	LastFailedAt time.Time `json:"lastFailedAt,omitzero"`
	// NextProcessAt is when a scheduled or retry run is due.
	NextProcessAt time.Time `json:"nextProcessAt,omitzero"`
	// CorrelationID is the run's correlation id.
	CorrelationID string `json:"correlationId,omitempty"`
	// CausationID is the run's causation id.
	CausationID string `json:"causationId,omitempty"`
	// Input is the job's input: the dispatched payload, the triggering
	// event's payload, or the tick.
	Input json.RawMessage `json:"input,omitempty"`
}

// Inspector lists and retries runs in the lanes' queues, for `kumiko jobs`
// and the admin API.
type Inspector struct {
	in     *asynq.Inspector
	rdb    redis.UniversalClient
	prefix string
}

// NewInspector returns an inspector of the queues under prefix ("" means
// [DefaultQueuePrefix]) on rdb, which it never closes.
func NewInspector(rdb redis.UniversalClient, prefix string) *Inspector {
	return &Inspector{in: asynq.NewInspectorFromRedisClient(rdb), rdb: rdb, prefix: cmp.Or(prefix, DefaultQueuePrefix)}
}

// ListOptions select runs for [Inspector.List]. A nil *ListOptions means
// the defaults.
type ListOptions struct {
	// State selects the runs. Defaults to StateArchived.
	State State
	// Lane limits the list to one lane. Defaults to both.
	Lane framework.RunIn
	// TenantID limits the list to one tenant's runs. Defaults to all.
	TenantID string
	// Limit is the most runs returned, between 1 and 1000. Defaults to 50.
	Limit int
}

// scanLimit bounds how many runs per queue List reads while filtering.
const scanLimit = 10000

// pageSize is how many runs List reads per Redis round trip.
const pageSize = 100

// List returns up to Limit runs in one state across the selected lanes and
// their priority queues: archived runs newest failure first, retry and
// scheduled runs soonest due first; pending, active and completed runs
// queue by queue (highest priority first), each queue oldest first. With a
// TenantID, at most 10000 runs per queue are scanned for the tenant's. An
// unknown state or lane, or a limit out of range, is an error naming the
// accepted values.
func (i *Inspector) List(ctx context.Context, opts *ListOptions) ([]TaskInfo, error) {
	var o ListOptions
	if opts != nil {
		o = *opts
	}
	o.State = cmp.Or(o.State, StateArchived)
	if !slices.Contains(States, o.State) {
		return nil, fmt.Errorf("jobs: unknown state %q (want one of %s)", o.State, joinStates())
	}
	lanes, err := i.lanes(o.Lane)
	if err != nil {
		return nil, err
	}
	o.Limit = cmp.Or(o.Limit, 50)
	if o.Limit < 1 || o.Limit > 1000 {
		return nil, fmt.Errorf("jobs: limit %d is not between 1 and 1000", o.Limit)
	}
	known, err := i.in.Queues()
	if err != nil {
		return nil, fmt.Errorf("jobs: queues: %w", err)
	}
	// Archived, retry and scheduled runs are ordered across queues: each
	// queue yields its first Limit runs in that order, then they are
	// merged. The others are listed queue after queue.
	merged := o.State == StateArchived || o.State == StateRetry || o.State == StateScheduled
	out := []TaskInfo{}
	for _, lane := range lanes {
		for _, q := range i.queues(lane) {
			want := o.Limit
			if !merged {
				want -= len(out)
			}
			if want == 0 || !slices.Contains(known, q) {
				continue
			}
			var runs []TaskInfo
			if o.State == StateArchived {
				runs, err = i.listNewestArchived(ctx, lane, q, o.TenantID, want)
			} else {
				runs, err = i.listInOrder(ctx, lane, q, i.lister(o.State), o.TenantID, want)
			}
			if err != nil {
				return nil, err
			}
			out = append(out, runs...)
		}
	}
	switch o.State {
	case StateArchived:
		slices.SortStableFunc(out, func(a, b TaskInfo) int { return b.LastFailedAt.Compare(a.LastFailedAt) })
	case StateRetry, StateScheduled:
		slices.SortStableFunc(out, func(a, b TaskInfo) int { return a.NextProcessAt.Compare(b.NextProcessAt) })
	}
	return out[:min(len(out), o.Limit)], nil
}

// listInOrder returns up to want runs of queue q (of tenant, if not "") in
// asynq's order: oldest first for lists, lowest score first for sets.
func (i *Inspector) listInOrder(ctx context.Context, lane framework.RunIn, q string, list func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error), tenant string, want int) ([]TaskInfo, error) {
	var out []TaskInfo
	for page := 1; (page-1)*pageSize < scanLimit && len(out) < want; page++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		infos, err := list(q, asynq.Page(page), asynq.PageSize(pageSize))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("jobs: list %s: %w", q, err)
		}
		for _, ti := range infos {
			if t := toTaskInfo(lane, ti); tenant == "" || t.TenantID == tenant {
				out = append(out, t)
			}
			if len(out) == want {
				break
			}
		}
		if len(infos) < pageSize {
			break
		}
	}
	return out, nil
}

// listNewestArchived returns up to want archived runs of queue q (of
// tenant, if not ""), newest first. asynq lists the archive (a set scored
// by archive time) oldest first, in pages counted from the oldest, so the
// pages are read from the last one back.
func (i *Inspector) listNewestArchived(ctx context.Context, lane framework.RunIn, q, tenant string, want int) ([]TaskInfo, error) {
	qi, err := i.in.GetQueueInfo(q)
	if err != nil {
		return nil, fmt.Errorf("jobs: queue %s: %w", q, err)
	}
	var out []TaskInfo
	// A run retried or deleted meanwhile shifts the later ones a place
	// back, which can show one twice.
	seen := map[string]bool{}
	scanned := 0
	for page := (qi.Archived + pageSize - 1) / pageSize; page >= 1 && scanned < scanLimit && len(out) < want; page-- {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		infos, err := i.in.ListArchivedTasks(q, asynq.Page(page), asynq.PageSize(pageSize))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("jobs: list %s: %w", q, err)
		}
		scanned += pageSize
		for k := len(infos) - 1; k >= 0 && len(out) < want; k-- {
			t := toTaskInfo(lane, infos[k])
			if seen[t.ID] || (tenant != "" && t.TenantID != tenant) {
				continue
			}
			seen[t.ID] = true
			out = append(out, t)
		}
	}
	return out, nil
}

// Get returns one run; lane "" searches both lanes. A missing run is
// [ErrTaskNotFound].
func (i *Inspector) Get(ctx context.Context, lane framework.RunIn, id string) (TaskInfo, error) {
	lanes, err := i.lanes(lane)
	if err != nil {
		return TaskInfo{}, err
	}
	// The known queues first: one plain read, whose error says what is
	// wrong (Redis unreachable) without asynq's nested error codes.
	known, err := i.in.Queues()
	if err != nil {
		return TaskInfo{}, fmt.Errorf("jobs: queues: %w", err)
	}
	for _, l := range lanes {
		for _, q := range i.queues(l) {
			if err := ctx.Err(); err != nil {
				return TaskInfo{}, err
			}
			if !slices.Contains(known, q) {
				continue // never used
			}
			ti, err := i.in.GetTaskInfo(q, id)
			switch {
			case errors.Is(err, asynq.ErrQueueNotFound), errors.Is(err, asynq.ErrTaskNotFound):
				continue
			case err != nil:
				return TaskInfo{}, fmt.Errorf("jobs: get %s: %w", id, err)
			}
			return toTaskInfo(l, ti), nil
		}
	}
	return TaskInfo{}, fmt.Errorf("%w: %s", ErrTaskNotFound, id)
}

// Retry puts an archived (or retry, or scheduled) run back on its queue to
// run now and returns it as it was; lane "" searches both lanes. A missing
// run is [ErrTaskNotFound], a pending, active or completed one
// [ErrNotRetryable]. An archived run of a Unique job takes the job's
// window again (its archiving freed it), so that equal dispatches are
// duplicates while it waits and runs; when an equal run holds the window
// meanwhile, the run is not retried and the error is [ErrDuplicate].
func (i *Inspector) Retry(ctx context.Context, lane framework.RunIn, id string) (TaskInfo, error) {
	t, err := i.Get(ctx, lane, id)
	if err != nil {
		return TaskInfo{}, err
	}
	switch t.State {
	case StateArchived, StateRetry, StateScheduled:
	default:
		return t, fmt.Errorf("%w (%s is %s)", ErrNotRetryable, id, t.State)
	}
	var lock string
	if t.State == StateArchived {
		if lock, err = i.takeUnique(ctx, t.Queue, id); err != nil {
			return t, err
		}
	}
	err = i.in.RunTask(t.Queue, id)
	if lock != "" {
		// The run is pending now (its lock no longer stale), or stays
		// archived and gives the window back.
		cctx := context.WithoutCancel(ctx)
		if err != nil {
			_ = releaseUniqueScript.Run(cctx, i.rdb, []string{lock}, id).Err()
		}
		_ = i.rdb.HDel(cctx, taskKey(t.Queue, id), retryingField).Err()
	}
	if err != nil {
		if errors.Is(err, asynq.ErrTaskNotFound) {
			return t, fmt.Errorf("%w: %s", ErrTaskNotFound, id)
		}
		return t, fmt.Errorf("jobs: retry %s: %w", id, err)
	}
	return t, nil
}

// takeUnique takes the Unique window of the archived run id of queue for
// it and returns the lock's key ("" when the run's job is not Unique, or
// was enqueued before runs carried their window). An equal run holding
// the window is [ErrDuplicate].
func (i *Inspector) takeUnique(ctx context.Context, queue, id string) (string, error) {
	ti, err := i.in.GetTaskInfo(queue, id)
	if err != nil {
		return "", fmt.Errorf("jobs: get %s: %w", id, err)
	}
	secs, _ := strconv.Atoi(ti.Headers[headerUnique])
	if secs <= 0 {
		return "", nil
	}
	// asynq records the lock's key in the task's hash.
	key, err := i.rdb.HGet(ctx, taskKey(queue, id), "unique_key").Result()
	switch {
	case errors.Is(err, redis.Nil) || (err == nil && key == ""):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("jobs: retry %s: %w", id, err)
	}
	switch took, err := takeUniqueScript.Run(ctx, i.rdb, []string{key, taskKey(queue, id)}, id,
		(time.Duration(secs) * time.Second).Milliseconds(), taskKey(queue, ""), retryingFor.Milliseconds()).Int(); {
	case err != nil:
		return "", fmt.Errorf("jobs: retry %s: %w", id, err)
	case took == 2:
		return "", fmt.Errorf("%w (%s is being retried already)", ErrNotRetryable, id)
	case took == 3:
		return "", fmt.Errorf("%w: %s", ErrTaskNotFound, id)
	case took != 1:
		return "", fmt.Errorf("%w: an equal run of %s holds its Unique window", ErrDuplicate, ti.Type)
	}
	return key, nil
}

// takeUniqueScript takes a Unique window (lock KEYS[1]) for the archived
// run ARGV[1] (task hash KEYS[2]) an operator retries, for ARGV[2] ms,
// and marks the run as being retried (retryingField), so that no equal
// dispatch frees the lock as an archived run's before asynq marks the run
// pending (see staleUniqueScript; ARGV[3] is the queue's task key prefix,
// ARGV[4] how long a mark holds). A lock held by a run that waits, runs or
// is being retried is kept: the answer is 0, or 2 when that run is this
// one (a concurrent retry of it), 3 when the run is gone (deleted
// meanwhile); 1 when the window was taken. A lock held
// by an archived run (this one among them: its workers died) or by none is
// taken.
var takeUniqueScript = redis.NewScript(`local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local holder = redis.call("GET", KEYS[1])
if holder then
  local h = redis.call("HMGET", ARGV[3] .. holder, "state", "` + retryingField + `")
  if (h[1] and h[1] ~= "archived") or (h[1] and h[2] and now - tonumber(h[2]) < tonumber(ARGV[4])) then
    if holder == ARGV[1] then return 2 end
    return 0
  end
end
local own = redis.call("HGET", KEYS[2], "state")
if not own then return 3 end
if own ~= "archived" then return 2 end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
redis.call("HSET", KEYS[2], "` + retryingField + `", now)
return 1`)

// Depth returns the runs waiting in a lane's queues: pending, scheduled and
// due for retry.
func (i *Inspector) Depth(ctx context.Context, lane framework.RunIn) (int, error) {
	known, err := i.in.Queues()
	if err != nil {
		return 0, fmt.Errorf("jobs: queues: %w", err)
	}
	n := 0
	for _, q := range i.queues(lane) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if !slices.Contains(known, q) {
			continue // never used
		}
		qi, err := i.in.GetQueueInfo(q)
		if err != nil {
			return 0, fmt.Errorf("jobs: queue %s: %w", q, err)
		}
		n += qi.Pending + qi.Scheduled + qi.Retry
	}
	return n, nil
}

// lanes resolves a lane filter ("" means both).
func (i *Inspector) lanes(lane framework.RunIn) ([]framework.RunIn, error) {
	switch lane {
	case "":
		return Lanes, nil
	case framework.RunInAPI, framework.RunInWorker:
		return []framework.RunIn{lane}, nil
	}
	return nil, fmt.Errorf("jobs: unknown lane %q (want api or worker)", lane)
}

// queues returns a lane's queues, highest priority first.
func (i *Inspector) queues(lane framework.RunIn) []string {
	return []string{QueueName(i.prefix, lane, PriorityHigh), QueueName(i.prefix, lane, PriorityDefault), QueueName(i.prefix, lane, PriorityLow)}
}

func (i *Inspector) lister(s State) func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error) {
	switch s {
	case StatePending:
		return i.in.ListPendingTasks
	case StateActive:
		return i.in.ListActiveTasks
	case StateScheduled:
		return i.in.ListScheduledTasks
	case StateRetry:
		return i.in.ListRetryTasks
	case StateCompleted:
		return i.in.ListCompletedTasks
	default:
		return i.in.ListArchivedTasks
	}
}

func toTaskInfo(lane framework.RunIn, ti *asynq.TaskInfo) TaskInfo {
	t := TaskInfo{
		ID: ti.ID, Job: ti.Type, Lane: lane, Queue: ti.Queue, State: State(ti.State.String()),
		Retried: ti.Retried, MaxRetry: max(ti.MaxRetry-crashReserve, 0), LastError: ti.LastErr, LastFailedAt: ti.LastFailedAt,
		NextProcessAt: ti.NextProcessAt,
		CorrelationID: ti.Headers[headerCorrelation], CausationID: ti.Headers[headerCausation],
	}
	if w, err := decodeWire(ti.Payload); err == nil {
		t.TenantID = w.Tenant
		switch {
		case w.Event != nil:
			t.Input = w.Event.Payload
		case w.Tick != 0:
			t.Input, _ = json.Marshal(map[string]any{"tick": time.Unix(w.Tick, w.TickNanos).UTC()})
		default:
			t.Input = w.Payload
		}
	}
	return t
}

func joinStates() string {
	s := make([]string, len(States))
	for i, st := range States {
		s[i] = string(st)
	}
	return strings.Join(s, ", ")
}
