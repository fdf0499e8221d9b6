package dispatcher

import (
	"context"
	"regexp"
	"strconv"

	"github.com/kumiko-go/kumiko/framework"
)

// SharedInstance is the instance id of shared consumers' state rows. It is
// reserved: no process may use it as its own instance id.
const SharedInstance = "__shared__"

// Consumer is one subscriber of the event log.
type Consumer struct {
	// Name is the persistent id of the consumer's cursor; never rename it.
	Name string
	// Delivery is shared (one cursor) or per-instance (one per process).
	// Defaults to shared.
	Delivery framework.Delivery
	// EventTypes the consumer reads; nil means every type.
	EventTypes []string
	// Apply handles one event in the pass's transaction, scoped to the
	// event's tenant (unless System). A panic is recovered and fails the
	// event like an error ("panic: <value>"; the stack is logged).
	Apply func(ctx context.Context, tx *framework.Tx, env framework.Envelope) error
	// System consumers run in the unrestricted system scope and skip the
	// per-tenant scoping round trips (they do not touch tenant tables).
	System bool
	// SkipApplyErrors records a failing event as a dead letter and moves on.
	// A pass lost under a handler (its connection ended, or its transaction
	// a deadlock or serialization victim) is no failure of the event: it is
	// retried as a transient one.
	SkipApplyErrors bool
	// MaxAttempts before the consumer turns dead. Defaults to 10.
	MaxAttempts int
	// Transient classifies an Apply error as transient (a dependency such
	// as Redis is unreachable): the event is retried with backoff, but the
	// failure does not count toward MaxAttempts and is never dead-lettered
	// (not even with SkipApplyErrors), so the consumer never turns dead for
	// it; the cursor waits until the error clears. An event stored at a
	// newer schema version than this code declares
	// ([framework.ErrNewerEventVersion]) is always transient. Defaults to
	// nil (no other error is transient).
	Transient func(error) bool
	// BatchSize is the number of events per pass. Defaults to the
	// dispatcher's batch size.
	BatchSize int
	// StartAtHead registers a new state row at the current end of the log
	// instead of its start (for live-only consumers such as SSE).
	StartAtHead bool
	// SearchPath, when set, is applied to every pass transaction with
	// set_config('search_path', SearchPath, true) before the handlers run
	// (a projection rebuild points unqualified table names at its shadow
	// schema this way). Defaults to the connection's search_path.
	SearchPath string
	// Partitions splits the consumer into that many state rows, named
	// [PartitionName](Name, i): partition i reads the events of the streams
	// that hash to i (kumiko_stream_partition), so passes of different
	// partitions run in parallel while each stream's events still arrive in
	// order. 0 and 1 mean one state row, named Name; at most
	// [framework.MaxPartitions]. Changing it later needs the partitions'
	// cursors lined up (see [Dispatcher.Register]). Defaults to 1.
	Partitions int
	// BeforeCommit, when set, runs in the pass transaction after the
	// handlers of a non-empty batch and before the cursor advance; an error
	// rolls the whole pass back and is returned by the pass (no retry
	// accounting, no dead letter); so does a panic, recovered as an error.
	// Defaults to nil.
	BeforeCommit func(ctx context.Context, db framework.DB) error
}

// FromProjection turns a registered multi-stream projection into a Consumer.
func FromProjection(p *framework.Projection) Consumer {
	o := p.Options()
	return Consumer{
		Name:            p.Name(),
		Delivery:        o.Delivery,
		EventTypes:      p.EventTypes(),
		Apply:           p.Apply,
		SkipApplyErrors: o.SkipApplyErrors,
		MaxAttempts:     o.MaxAttempts,
		BatchSize:       o.BatchSize,
		Partitions:      o.Partitions,
	}
}

// PartitionName is the state-row name of partition i of the consumer name,
// e.g. "orders:order-totals@2".
func PartitionName(name string, i int) string { return name + "@" + strconv.Itoa(i) }

// partitionSuffix matches the suffix PartitionName adds; consumer names may
// not end with it.
var partitionSuffix = regexp.MustCompile(`@[0-9]+$`)

// ProjectionConsumers returns a Consumer for every multi-stream projection
// of reg whose RunIn is accepted by keep (nil keeps all).
func ProjectionConsumers(reg *framework.Registry, keep func(framework.RunIn) bool) []Consumer {
	var out []Consumer
	for _, p := range reg.Projections() {
		if p.Kind() != framework.KindMultiStream {
			continue
		}
		if keep != nil && !keep(p.Options().RunIn) {
			continue
		}
		out = append(out, FromProjection(p))
	}
	return out
}
