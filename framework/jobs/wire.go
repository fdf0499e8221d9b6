package jobs

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kumiko-go/kumiko/framework"
)

// DefaultQueuePrefix prefixes the lanes' asynq queue names:
// kumiko-jobs-api and kumiko-jobs-worker (and their -high and -low
// priority queues).
const DefaultQueuePrefix = "kumiko-jobs"

// Task header names.
const (
	headerCorrelation = "kumiko-correlation-id"
	headerCausation   = "kumiko-causation-id"
	headerUser        = "kumiko-user-id"
	headerEventAt     = "kumiko-event-at"
	// headerRun tells apart the runs of a derived task id: the id is taken
	// again once asynq has dropped its earlier run (a Key after its window,
	// a rewound trigger), and the new run's children must not be the
	// earlier run's (see childTaskID). Every attempt of one run has it.
	headerRun = "kumiko-run-id"
	// headerParent names the run that dispatched a task through
	// [Context.Dispatch] (see parentRun), so that a retry of that run can
	// tell its earlier attempt's keyed child from another run's.
	headerParent = "kumiko-parent-run"
	// headerUnique carries a Unique job's window in whole seconds, so that
	// [Inspector.Retry] can take the window again for an archived run
	// (asynq keeps the lock's key with the task, not its length).
	headerUnique = "kumiko-unique-seconds"
)

// wire is a task's payload: the tenant and the job's input. The ids travel
// in headers, so that a job's Unique window compares inputs, not requests.
type wire struct {
	// Tenant owns the run.
	Tenant string `json:"tenant"`
	// Payload is a manual job's input.
	Payload json.RawMessage `json:"payload,omitempty"`
	// Event is an event job's triggering event.
	Event *wireEvent `json:"event,omitempty"`
	// Tick is a cron job's tick (Unix seconds).
	Tick int64 `json:"tick,omitempty"`
	// TickNanos is the tick's fraction of a second (an "@every" of a
	// duration that is not whole seconds has such ticks).
	TickNanos int64 `json:"tickNanos,omitempty"`
}

// wireEvent is an event as it travels in a task.
type wireEvent struct {
	Position    int64              `json:"position"`
	CommitKey   uint64             `json:"commitKey"`
	StreamType  string             `json:"streamType"`
	StreamID    string             `json:"streamId"`
	Version     int64              `json:"version"`
	Type        string             `json:"type"`
	TypeVersion int                `json:"typeVersion"`
	Payload     json.RawMessage    `json:"payload"`
	Metadata    framework.Metadata `json:"metadata"`
	CreatedAt   time.Time          `json:"createdAt"`
}

func toWireEvent(env framework.Envelope) *wireEvent {
	return &wireEvent{
		Position: env.Position, CommitKey: env.CommitKey, StreamType: env.StreamType, StreamID: env.StreamID,
		Version: env.Version, Type: env.Type, TypeVersion: env.TypeVersion, Payload: env.Payload,
		Metadata: env.Metadata, CreatedAt: env.CreatedAt,
	}
}

func (w *wireEvent) envelope(tenant string) framework.Envelope {
	return framework.Envelope{
		Position: w.Position, CommitKey: w.CommitKey, TenantID: tenant, StreamType: w.StreamType, StreamID: w.StreamID,
		Version: w.Version, Type: w.Type, TypeVersion: w.TypeVersion, Payload: w.Payload,
		Metadata: w.Metadata, CreatedAt: w.CreatedAt,
	}
}

// decodeWire reads a task's payload.
func decodeWire(b []byte) (*wire, error) {
	var w wire
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, fmt.Errorf("decode task payload: %w", err)
	}
	if w.Tenant == "" {
		return nil, fmt.Errorf("decode task payload: no tenant")
	}
	return &w, nil
}

// QueueName returns the asynq queue of a lane and priority under prefix
// ("" means [DefaultQueuePrefix]).
func QueueName(prefix string, lane framework.RunIn, p Priority) string {
	if prefix == "" {
		prefix = DefaultQueuePrefix
	}
	q := prefix + "-" + string(lane)
	switch p {
	case PriorityHigh:
		return q + "-high"
	case PriorityLow:
		return q + "-low"
	default:
		return q
	}
}

// laneQueues returns the queues of a lane that its jobs use, with their
// asynq weights (high 6, default 3, low 1). An idle queue costs a Redis
// round trip on most pulls, so only used priorities are listened to.
func laneQueues(prefix string, lane framework.RunIn, jobs []*Job) map[string]int {
	out := map[string]int{}
	for _, j := range jobs {
		out[QueueName(prefix, lane, j.opts.Priority)] = priorityWeight[j.opts.Priority]
	}
	return out
}

// priorityWeight is the asynq weight of each priority's queue.
var priorityWeight = map[Priority]int{PriorityHigh: 6, PriorityDefault: 3, PriorityLow: 1}

// Task ids. They are derived from what triggered the run, so that a second
// enqueue of the same trigger conflicts (asynq.ErrTaskIDConflict) instead of
// running twice; completed runs are retained for the dedup window to keep
// their ids taken.
func eventTaskID(job string, position int64) string {
	return job + "@event-" + strconv.FormatInt(position, 10)
}

func dispatchTaskID(job string, position int64) string {
	return job + "@dispatch-" + strconv.FormatInt(position, 10)
}

func tickTaskID(job string, tick time.Time) string {
	return job + "@tick-" + strconv.FormatInt(tick.Unix(), 10)
}

func keyTaskID(job, tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	return job + "@key-" + hex.EncodeToString(sum[:12])
}

// childTaskID is the id of the n-th dispatch (from 1) of job without a Key
// by the run parent (its task id; run, its run id header, tells it from
// another run that reused a derived id) through [Context.Dispatch]. Like a
// key, the parent's id is hashed: it is itself derived and may be a
// child's, so that ids stay short along a chain of dispatches, and the
// NULs keep (parent, run, n) unambiguous. A run without a run id (enqueued
// by an earlier version) hashes (parent, n).
func childTaskID(job, parent, run string, n int) string {
	if run != "" {
		parent += "\x00" + run
	}
	sum := sha256.Sum256([]byte(parent + "\x00" + strconv.Itoa(n)))
	return job + "@child-" + hex.EncodeToString(sum[:12])
}

// parentRun names one run of a job for the children it dispatches: its
// task id and its run id (which tells it from another run under the same
// derived task id; "" for a run without one, whose task id is a fresh
// uuid). Every attempt of the run has the same name.
func parentRun(taskID, run string) string {
	if run == "" {
		return taskID
	}
	return taskID + " " + run
}

// taskKey is the Redis key of asynq's hash of a task (asynq's storage
// layout, which persisted queues depend on).
func taskKey(queue, taskID string) string {
	return "asynq:{" + queue + "}:t:" + taskID
}

// uniqueKey is asynq's key of the Unique lock of task on queue (its
// base.UniqueKey; payloads here are never nil). Its value is the id of
// the run holding the lock.
func uniqueKey(queue string, task *asynq.Task) string {
	sum := md5.Sum(task.Payload())
	return "asynq:{" + queue + "}:unique:" + task.Type() + ":" + hex.EncodeToString(sum[:])
}

// newTask builds the asynq task of a job run.
func newTask(j *Job, w *wire, headers map[string]string) (*asynq.Task, error) {
	var b []byte
	if w.Event == nil && w.Tick == 0 && len(w.Payload) > 0 {
		// A manual run: the payload is JSON already (marshalled or checked
		// by the caller, or read from the log); skip re-encoding it.
		t, err := json.Marshal(w.Tenant)
		if err != nil {
			return nil, fmt.Errorf("encode task payload: %w", err)
		}
		b = make([]byte, 0, len(t)+len(w.Payload)+24)
		b = append(append(append(append(b, `{"tenant":`...), t...), `,"payload":`...), w.Payload...)
		b = append(b, '}')
	} else {
		var err error
		if b, err = json.Marshal(w); err != nil {
			return nil, fmt.Errorf("encode task payload: %w", err)
		}
	}
	var h map[string]string
	for k, v := range headers {
		if v != "" {
			if h == nil {
				h = make(map[string]string, len(headers))
			}
			h[k] = v
		}
	}
	if h == nil {
		return asynq.NewTask(j.name, b), nil
	}
	return asynq.NewTaskWithHeaders(j.name, b, h), nil
}
