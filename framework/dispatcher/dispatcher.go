package dispatcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/tenancy"
	"github.com/kumiko-go/kumiko/internal/retry"
)

// Config tunes [New]. A nil *Config is invalid (InstanceID is required).
type Config struct {
	// InstanceID identifies this process's per-instance cursors. Required;
	// SharedInstance is refused.
	InstanceID string
	// Logger receives failures and state changes. Defaults to discarding.
	Logger *slog.Logger
	// PollInterval is the fallback poll period (jittered by ±20%). Defaults
	// to 100ms.
	PollInterval time.Duration
	// PollOnly disables LISTEN (behind a transaction-pooling PgBouncer).
	// Defaults to false.
	PollOnly bool
	// BatchSize is the number of events per pass. Defaults to 500.
	BatchSize int
	// MaxConcurrentPasses bounds how many consumers run a pass at once (each
	// holds a pool connection). Defaults to 2.
	MaxConcurrentPasses int
	// RetryBaseDelay is the first retry's delay; it doubles per attempt.
	// Defaults to 200ms.
	RetryBaseDelay time.Duration
	// RetryMaxDelay caps the retry delay. Defaults to 30s.
	RetryMaxDelay time.Duration
	// ReviveCooldown is how long a consumer stays dead before it is revived
	// automatically. Defaults to 5m.
	ReviveCooldown time.Duration
	// MaxRevivals caps automatic revivals until a delivery succeeds.
	// Defaults to 3; a negative value turns automatic revival off.
	MaxRevivals int
	// HeartbeatInterval is how often per-instance rows are touched, lag is
	// measured and stale rows are removed. Defaults to 10s.
	HeartbeatInterval time.Duration
	// StaleInstanceAfter removes per-instance rows silent for this long. A
	// process that is still running when its rows are removed re-creates
	// them at the cursors it last committed. Defaults to 10m.
	StaleInstanceAfter time.Duration
	// NotifyInterval is the minimum gap between two coalesced NOTIFYs.
	// Defaults to 5ms.
	NotifyInterval time.Duration
	// PassTimeout bounds the handlers of one pass. Once it has passed, the
	// pass runs no further handler and commits the events handled before;
	// the handler running at the deadline is cut short (its context ends)
	// and its event rolled back, and the next pass starts with it, at once
	// and without counting an attempt: a batch whose handlers together
	// outlast PassTimeout commits in parts. Only an event that is the first
	// of its pass, whose handler alone outlasts PassTimeout, fails as with
	// an error (attempts, backoff, dead letter). The commit, and each
	// re-run after a failure, get PassTimeout of their own. Defaults to
	// 60s.
	PassTimeout time.Duration
	// Metrics registers the dispatcher's collectors. Defaults to none.
	Metrics prometheus.Registerer
	// Reserve are shared consumers this process does not run, whose state
	// rows [Dispatcher.Register] creates all the same, at the start of the
	// log, when the consumer has no row yet (a row it has, in any
	// partitioning, is left as it is): until the processes that run it
	// deliver, its row holds back a prune of its types, shows its lag and
	// takes the consumer verbs (disable lets the prune go on). Only Name,
	// EventTypes and Partitions are read. The entrypoint reserves the
	// shared projections with runIn api, which api and worker processes do
	// not run. Defaults to none.
	Reserve []Consumer
}

// NotifyChannel is the Postgres channel of the coalesced wake-up NOTIFY.
const NotifyChannel = "kumiko_events"

// ErrReservedInstance is returned when the instance id is SharedInstance.
var ErrReservedInstance = errors.New("dispatcher: instance id __shared__ is reserved for shared consumers")

// Dispatcher runs passes for its consumers until its context ends.
type Dispatcher struct {
	pool      *pgxpool.Pool
	reg       *framework.Registry
	cfg       Config
	log       *slog.Logger
	consumers []*consumerRun
	byName    map[string]*consumerRun // by state-row name
	bases     map[string]layout       // by declared name
	reserved  []reservedRow           // Config.Reserve
	slots     chan struct{}
	notifyReq chan struct{}
	metrics   *metrics
	// registered is set once Register has created the state rows.
	registered atomic.Bool
}

// consumerRun is a consumer with its resolved state-row key and wake chan.
type consumerRun struct {
	Consumer // Name is the state row's: PartitionName(base, part) when partitioned
	// base is the declared name; part the partition's index (0 of 1 when
	// the consumer is not partitioned).
	base     string
	part     int
	instance string
	wake     chan struct{}
	lockKey  string
	// transientStreak counts consecutive transient failures (the backoff
	// exponent for errors that do not count as attempts).
	transientStreak atomic.Int32
	// mu guards known, victimAt and victims.
	mu sync.Mutex
	// victims counts the passes of this process lost in a row as deadlock
	// or serialization victims at the event at position victimAt (see
	// VictimRetries).
	victimAt int64
	victims  int
	// known is the state row as this process last read or committed it:
	// what a per-instance row removed under the running process is
	// re-created from (see recreate).
	known knownState
}

// knownState is what a process remembers of its consumer's state row.
type knownState struct {
	ok       bool
	cursor   eventstore.Cursor
	disabled bool
}

// remember records the state row's cursor (and status, when given).
func (c *consumerRun) remember(cur eventstore.Cursor, status string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.known.ok = true
	c.known.cursor = cur
	if status != "" {
		c.known.disabled = status == "disabled"
	}
}

// noteVictim counts a pass lost as a deadlock or serialization victim at
// the event at position, and returns how many in a row were lost at it.
func (c *consumerRun) noteVictim(position int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.victims == 0 || c.victimAt != position {
		c.victimAt, c.victims = position, 0
	}
	c.victims++
	return c.victims
}

// clearVictims ends a run of victim losses: the event was delivered, or a
// pass ended otherwise.
func (c *consumerRun) clearVictims() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.victims = 0
}

// knownRow returns what remember recorded.
func (c *consumerRun) knownRow() knownState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.known
}

// New validates the consumers and returns a dispatcher. It builds reg
// ([framework.Registry.Build]; the events handlers append run the inline
// projections of a built registry only) and fails on its registration
// problems, the reserved instance id, an empty or duplicate consumer name,
// or a nil Apply.
func New(pool *pgxpool.Pool, reg *framework.Registry, consumers []Consumer, cfg *Config) (*Dispatcher, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if reg != nil {
		if err := reg.Build(); err != nil {
			return nil, fmt.Errorf("dispatcher: registry: %w", err)
		}
	}
	c := *cfg
	if c.InstanceID == "" {
		return nil, errors.New("dispatcher: instance id is required")
	}
	if c.InstanceID == SharedInstance {
		return nil, ErrReservedInstance
	}
	c.PollInterval = cmp.Or(c.PollInterval, 100*time.Millisecond)
	c.BatchSize = cmp.Or(c.BatchSize, 500)
	c.MaxConcurrentPasses = cmp.Or(c.MaxConcurrentPasses, 2)
	c.RetryBaseDelay = cmp.Or(c.RetryBaseDelay, 200*time.Millisecond)
	c.RetryMaxDelay = cmp.Or(c.RetryMaxDelay, 30*time.Second)
	c.ReviveCooldown = cmp.Or(c.ReviveCooldown, 5*time.Minute)
	c.MaxRevivals = cmp.Or(c.MaxRevivals, 3)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, 10*time.Second)
	c.StaleInstanceAfter = cmp.Or(c.StaleInstanceAfter, 10*time.Minute)
	c.NotifyInterval = cmp.Or(c.NotifyInterval, 5*time.Millisecond)
	c.PassTimeout = cmp.Or(c.PassTimeout, 60*time.Second)
	if err := c.checkSigns(); err != nil {
		return nil, err
	}
	d := &Dispatcher{
		pool: pool, reg: reg, cfg: c,
		log:       cmp.Or(c.Logger, slog.New(slog.DiscardHandler)),
		byName:    map[string]*consumerRun{},
		bases:     map[string]layout{},
		slots:     make(chan struct{}, c.MaxConcurrentPasses),
		notifyReq: make(chan struct{}, 1),
	}
	var problems []error
	for _, cons := range consumers {
		if cons.Name == "" {
			problems = append(problems, errors.New("dispatcher: consumer without name"))
			continue
		}
		if cons.Apply == nil {
			problems = append(problems, fmt.Errorf("dispatcher: consumer %s has no Apply", cons.Name))
		}
		if partitionSuffix.MatchString(cons.Name) {
			problems = append(problems, fmt.Errorf("dispatcher: consumer name %s ends like a partition's state row (@<number>)", cons.Name))
			continue
		}
		if cons.Partitions < 0 || cons.Partitions > framework.MaxPartitions {
			problems = append(problems, fmt.Errorf("dispatcher: consumer %s: partitions %d is not between 1 and %d",
				cons.Name, cons.Partitions, framework.MaxPartitions))
			continue
		}
		if cons.BatchSize < 0 {
			problems = append(problems, fmt.Errorf("dispatcher: consumer %s: BatchSize must not be negative (got %d)", cons.Name, cons.BatchSize))
		}
		if cons.MaxAttempts < 0 {
			problems = append(problems, fmt.Errorf("dispatcher: consumer %s: MaxAttempts must not be negative (got %d)", cons.Name, cons.MaxAttempts))
		}
		if _, dup := d.bases[cons.Name]; dup {
			problems = append(problems, fmt.Errorf("dispatcher: consumer %s registered twice", cons.Name))
			continue
		}
		cons.Delivery = cmp.Or(cons.Delivery, framework.DeliveryShared)
		cons.MaxAttempts = cmp.Or(cons.MaxAttempts, 10)
		cons.BatchSize = cmp.Or(cons.BatchSize, c.BatchSize)
		cons.BeforeCommit = recoverBeforeCommit(cons.BeforeCommit)
		cons.Partitions = max(cons.Partitions, 1)
		inst := SharedInstance
		if cons.Delivery == framework.DeliveryPerInstance {
			inst = c.InstanceID
		}
		d.bases[cons.Name] = layout{base: cons.Name, instance: inst, partitions: cons.Partitions}
		for i := range cons.Partitions {
			pc := cons
			if cons.Partitions > 1 {
				pc.Name = PartitionName(cons.Name, i)
			}
			cr := &consumerRun{Consumer: pc, base: cons.Name, part: i, instance: inst,
				wake: make(chan struct{}, 1), lockKey: LockKey(pc.Name, inst)}
			d.consumers = append(d.consumers, cr)
			d.byName[pc.Name] = cr
		}
	}
	for _, r := range c.Reserve {
		switch _, dup := d.bases[r.Name]; {
		case r.Name == "" || partitionSuffix.MatchString(r.Name) || r.Partitions < 0 || r.Partitions > framework.MaxPartitions:
			problems = append(problems, fmt.Errorf("dispatcher: reserved consumer %q: bad name or partitions", r.Name))
		case dup || slices.ContainsFunc(d.reserved, func(o reservedRow) bool { return o.base == r.Name }):
			problems = append(problems, fmt.Errorf("dispatcher: consumer %s registered twice", r.Name))
		default:
			d.reserved = append(d.reserved, reservedRow{base: r.Name, types: r.EventTypes, partitions: max(r.Partitions, 1)})
		}
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	var err error
	if d.metrics, err = newMetrics(c.Metrics); err != nil {
		return nil, err
	}
	// Every consumer's counters exist from the start, at 0: a series that
	// appears with its first failure has no sample before it, so rate()
	// and increase() miss that failure.
	for _, cr := range d.consumers {
		d.metrics.processed.WithLabelValues(cr.Name, cr.instance)
		d.metrics.failed.WithLabelValues(cr.Name, cr.instance)
		d.metrics.lost.WithLabelValues(cr.Name, cr.instance)
	}
	return d, nil
}

// LockKey is the key of the transaction advisory lock a pass of the
// consumer (name, instance) holds (hashed with hashtextextended); ops verbs
// and rebuilds take the same lock to exclude passes.
func LockKey(name, instance string) string { return name + "\x1f" + instance }

// InstanceID returns the process's instance id.
func (d *Dispatcher) InstanceID() string { return d.cfg.InstanceID }

// Consumers lists the names of the dispatcher's consumers.
func (d *Dispatcher) Consumers() []string {
	out := make([]string, len(d.consumers))
	for i, c := range d.consumers {
		out[i] = c.Name
	}
	return out
}

// Wake makes every consumer of this process run a pass soon and schedules
// one coalesced NOTIFY for the other processes. Call it after a commit that
// wrote events; it never blocks.
func (d *Dispatcher) Wake() {
	d.wakeLocal()
	select {
	case d.notifyReq <- struct{}{}:
	default:
	}
}

func (d *Dispatcher) wakeLocal() {
	for _, c := range d.consumers {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// registerSQL creates a state row. StartAtHead puts the cursor just below
// the visibility horizon of this statement's snapshot, (xmin - 1, max
// position): every event below it is final, and an event of a transaction
// still open now has a commit key >= xmin, so it is still delivered. (The
// largest stored commit key would skip such events.)
const registerSQL = `INSERT INTO event_consumers (name, instance_id, event_types, cursor_commit_key, cursor_position,
  partition_index, partition_count)
SELECT $1, $2, $3,
       CASE WHEN $4 THEN ((pg_snapshot_xmin(pg_current_snapshot())::text::numeric - 1)::text)::xid8 ELSE '0'::xid8 END,
       CASE WHEN $4 THEN 9223372036854775807 ELSE 0 END,
       $5, $6
ON CONFLICT (name, instance_id) DO UPDATE SET event_types = EXCLUDED.event_types, heartbeat_at = now()
RETURNING cursor_commit_key, cursor_position, status`

// reservedRow is a consumer of Config.Reserve.
type reservedRow struct {
	base       string
	types      []string
	partitions int
}

// reserveSQL creates the shared state rows of a reserved consumer ($1, of
// types $2, in $3 partitions) at the start of the log, as a process that
// runs it registers them, unless a row of it exists in any partitioning.
const reserveSQL = `INSERT INTO event_consumers (name, instance_id, event_types, cursor_commit_key, cursor_position,
  partition_index, partition_count)
SELECT CASE WHEN $3::int > 1 THEN $1 || '@' || i ELSE $1 END, '__shared__', $2, '0'::xid8, 0, i, $3
FROM generate_series(0, $3::int - 1) AS i
WHERE NOT EXISTS (SELECT 1 FROM event_consumers c WHERE c.instance_id = '__shared__'
  AND (c.name = $1 OR (starts_with(c.name, $1 || '@') AND substr(c.name, length($1) + 2) ~ '^[0-9]+$')))
ON CONFLICT (name, instance_id) DO NOTHING`

// Register creates every consumer's state row (cursor at the start of the
// log, or at its head for StartAtHead) before any pass runs, so that a prune
// cannot delete what a consumer has not seen. Run calls it first.
//
// A consumer whose Partitions changed since its rows were stored gets new
// rows at the furthest stored cursor, when the stored rows line up: none of
// them has an event left to deliver before it (one cursor, as an
// unpartitioned consumer has, always lines up); the stored rows' dead
// letters go to the new partition of their event's stream. Otherwise Register fails
// with a *[LayoutError] and changes nothing. It creates the rows of the
// reserved consumers ([Config].Reserve) that have none.
func (d *Dispatcher) Register(ctx context.Context) error {
	tx, err := d.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("dispatcher: register consumers: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := d.lineUp(ctx, tx); err != nil {
		if errors.Is(err, ErrLayout) {
			return err
		}
		return fmt.Errorf("dispatcher: register consumers: %w", err)
	}
	b := &pgx.Batch{}
	for _, c := range d.consumers {
		b.Queue(registerSQL, c.Name, c.instance, c.EventTypes, c.StartAtHead, c.part, c.Partitions).QueryRow(func(r pgx.Row) error {
			var cur eventstore.Cursor
			var status string
			if err := r.Scan(&cur.CommitKey, &cur.Position, &status); err != nil {
				return err
			}
			c.remember(cur, status)
			return nil
		})
	}
	for _, r := range d.reserved {
		b.Queue(reserveSQL, r.base, r.types, r.partitions)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("dispatcher: register consumers: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("dispatcher: register consumers: %w", err)
	}
	d.registered.Store(true)
	return nil
}

// Registered reports whether Register has created the state rows of the
// dispatcher's consumers (readiness checks wait for it).
func (d *Dispatcher) Registered() bool { return d.registered.Load() }

// Run registers the consumers, then runs passes until ctx ends; the pass in
// flight finishes first. Registration is retried with backoff while it
// fails (the database may not answer yet, or not be migrated yet, when a
// process starts); Registered stays false meanwhile. It returns nil when
// ctx ends, and the *[LayoutError] of a registration that cannot succeed.
func (d *Dispatcher) Run(ctx context.Context) error {
	if ok, err := d.registerRetrying(ctx); !ok {
		return err
	}
	var wg sync.WaitGroup
	for _, c := range d.consumers {
		wg.Go(func() { d.loop(ctx, c) })
	}
	wg.Go(func() { d.notifyLoop(ctx) })
	if !d.cfg.PollOnly {
		wg.Go(func() { d.listenLoop(ctx) })
	}
	wg.Go(func() { d.maintenanceLoop(ctx) })
	wg.Wait()
	return nil
}

// registerRetrying calls Register until it succeeds (true) or ctx ends
// (false), logging each failure; a *LayoutError ends it at once, returned.
func (d *Dispatcher) registerRetrying(ctx context.Context) (bool, error) {
	var refused error
	ok := retry.Until(ctx, d.Register, func(err error, retryIn time.Duration) bool {
		if errors.Is(err, ErrLayout) {
			refused = err // no retry changes it
			return false
		}
		d.log.Warn("dispatcher registration failed", "error", err, "retry_in", retryIn.String())
		return true
	})
	return ok, refused
}

// checkSigns refuses the negative durations and sizes of c: a negative
// poll interval, say, would make every poll wait panic, and a negative
// batch size fail every pass in SQL.
func (c *Config) checkSigns() error {
	for _, v := range []struct {
		name string
		val  int64
	}{
		{"BatchSize", int64(c.BatchSize)}, {"MaxConcurrentPasses", int64(c.MaxConcurrentPasses)},
		{"PollInterval", int64(c.PollInterval)},
		{"RetryBaseDelay", int64(c.RetryBaseDelay)}, {"RetryMaxDelay", int64(c.RetryMaxDelay)},
		{"ReviveCooldown", int64(c.ReviveCooldown)}, {"HeartbeatInterval", int64(c.HeartbeatInterval)},
		{"StaleInstanceAfter", int64(c.StaleInstanceAfter)}, {"NotifyInterval", int64(c.NotifyInterval)},
		{"PassTimeout", int64(c.PassTimeout)},
	} {
		if v.val < 0 {
			return fmt.Errorf("dispatcher: %s must not be negative (got %d)", v.name, v.val)
		}
	}
	return nil
}

// maxJitterable bounds the interval jitter spreads: beyond it the ±20%
// would overflow a Duration (an interval of centuries is "never" anyway).
const maxJitterable = time.Duration(math.MaxInt64 / 2)

// jitter returns interval ±20%.
func jitter(interval time.Duration) time.Duration {
	interval = min(max(interval, 0), maxJitterable)
	return interval/10*8 + time.Duration(rand.Int64N(int64(interval/10*4)+1))
}

// maxInvisiblePoll caps the re-poll while events wait above the horizon.
// The transaction that holds the horizon back may end without waking this
// process, so that re-poll, not the NOTIFY, delivers those events; a long
// PollInterval (a process that relies on LISTEN) must not delay them.
const maxInvisiblePoll = 100 * time.Millisecond

// loop runs passes of one consumer: at once while batches come back full,
// otherwise on a wake-up, a poll tick or a due retry.
func (d *Dispatcher) loop(ctx context.Context, c *consumerRun) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	fast := time.Duration(0) // the short re-poll while events wait above the horizon
	for {
		select {
		case <-ctx.Done():
			return
		case d.slots <- struct{}{}:
		}
		// A select picks any of its ready cases: once ctx has ended, no
		// new pass starts, also when a slot, a wake-up or a full batch's
		// follow-up was ready too.
		if ctx.Err() != nil {
			<-d.slots
			return
		}
		// A pass in flight finishes even when ctx ends (drain); PassTimeout
		// bounds its handlers (see Config.PassTimeout).
		passCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.PassTimeout)
		res, err := d.pass(passCtx, c)
		cancel()
		<-d.slots
		if err != nil && ctx.Err() == nil {
			attrs := []any{"consumer", c.Name, "instance_id", c.instance, "error", err}
			if pe, ok := errors.AsType[*panicError](err); ok {
				attrs = append(attrs, "stack", string(pe.stack))
			}
			if framework.DatabaseUnreachable(err) {
				// An outage: the loop retries, as it does registration,
				// LISTEN and heartbeats, which warn too.
				d.log.Warn("dispatcher pass failed", attrs...)
			} else {
				d.log.Error("dispatcher pass failed", attrs...)
			}
		}
		if err == nil && res.full {
			continue
		}
		wait := jitter(d.cfg.PollInterval)
		if err == nil && res.invisible {
			fast = min(max(fast*2, 2*time.Millisecond), d.cfg.PollInterval, maxInvisiblePoll)
			wait = min(wait, fast)
		} else {
			fast = 0
		}
		if err != nil {
			wait = max(wait, time.Second)
		}
		if !res.retryAt.IsZero() {
			wait = min(wait, max(time.Until(res.retryAt), time.Millisecond))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-timer.C:
		}
	}
}

// passResult says what a pass did.
type passResult struct {
	// delivered counts events whose cursor advance committed.
	delivered int
	// full is set when the batch was full (more may be waiting).
	full bool
	// skipped is set when another process held the consumer's lock.
	skipped bool
	// retryAt is when a failed event becomes due again.
	retryAt time.Time
	// invisible is set when committed-or-not events wait above the horizon:
	// they become visible when an older transaction ends, which may not wake
	// this process, so the loop polls again soon.
	invisible bool
}

// RunOnce runs one pass of the named consumer and returns the number of
// events it delivered. Tests and tools use it; Run is the production loop.
func (d *Dispatcher) RunOnce(ctx context.Context, name string) (int, error) {
	c := d.byName[name]
	if c == nil {
		return 0, fmt.Errorf("dispatcher: unknown consumer %q", name)
	}
	res, err := d.pass(ctx, c)
	return res.delivered, err
}

const (
	lockSQL  = `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`
	stateSQL = `SELECT status, attempts, failed_position, next_attempt_at, now(), cursor_commit_key, cursor_position
FROM event_consumers WHERE name = $1 AND instance_id = $2`
	// batchSQL reads after the consumer's cursor, below the horizon taken in
	// this same statement.
	batchSQL = `SELECT e.position, e.commit_key, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type, e.type_version, e.payload, e.metadata, e.created_at
FROM event_consumers c
JOIN LATERAL (
  SELECT * FROM events
  WHERE (commit_key, position) > (c.cursor_commit_key, c.cursor_position)
    AND commit_key < pg_snapshot_xmin(pg_current_snapshot())
    AND (c.event_types IS NULL OR type = ANY(c.event_types))
    AND (c.partition_count = 1 OR kumiko_stream_partition(stream_id, c.partition_count) = c.partition_index)
  ORDER BY commit_key, position
  LIMIT $3
) e ON true
WHERE c.name = $1 AND c.instance_id = $2
ORDER BY e.commit_key, e.position`
	// pendingSQL looks for events after the cursor that are not visible
	// yet (above the horizon), of the consumer's types and partition: only
	// those are worth polling for soon. It runs before batchSQL, in its own
	// statement and so with its own horizon: the horizon only moves
	// forward, so an event the batch leaves above its horizon is above this
	// earlier one too. Run after the batch, a horizon that moved between
	// the two hid such an event from both, and it waited for the next
	// poll. The price is a rare extra re-poll for an event the batch
	// delivered after the horizon moved past it.
	pendingSQL = `SELECT EXISTS (SELECT 1 FROM events e, event_consumers c
  WHERE c.name = $1 AND c.instance_id = $2
    AND e.commit_key >= pg_snapshot_xmin(pg_current_snapshot())
    AND (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
    AND (c.event_types IS NULL OR e.type = ANY(c.event_types))
    AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index))`
	advanceSQL = `UPDATE event_consumers SET cursor_commit_key = $3, cursor_position = $4,
  attempts = 0, failed_position = NULL, last_error = NULL, next_attempt_at = NULL, revivals = 0,
  events_processed = events_processed + $5, updated_at = now()
WHERE name = $1 AND instance_id = $2`
	// failSQL records a failure after $5 events before it were delivered;
	// a delivery resets the revival budget, as advanceSQL does.
	failSQL = `UPDATE event_consumers SET cursor_commit_key = $3, cursor_position = $4,
  events_processed = events_processed + $5,
  revivals = CASE WHEN $5 > 0 THEN 0 ELSE revivals END,
  attempts = $6, failed_position = $7, last_error = $8,
  next_attempt_at = now() + $9::interval,
  status = CASE WHEN $10 THEN 'dead' ELSE status END,
  dead_at = CASE WHEN $10 THEN now() ELSE dead_at END,
  updated_at = now()
WHERE name = $1 AND instance_id = $2`
	deadLetterSQL = `INSERT INTO event_dead_letters (consumer, instance_id, position, event_type, tenant_id, error)
VALUES ($1, $2, $3, $4, $5, $6)`
)

// consumerState is the state row as a pass sees it.
type consumerState struct {
	status         string
	attempts       int
	failedPosition *int64
	nextAttemptAt  *time.Time
	now            time.Time
	cursor         eventstore.Cursor
}

// begin opens a pass transaction: BEGIN, the try-lock, the state row and
// the batch, pipelined in one round trip.
func (d *Dispatcher) begin(ctx context.Context, conn *pgx.Conn, c *consumerRun, limit int) (locked bool, st consumerState, recs []eventstore.Record, invisible bool, err error) {
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	if c.SearchPath != "" {
		b.Queue(`SELECT set_config('search_path', $1, true)`, c.SearchPath)
	}
	b.Queue(lockSQL, c.lockKey).QueryRow(func(r pgx.Row) error { return r.Scan(&locked) })
	found := false
	b.Queue(stateSQL, c.Name, c.instance).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			found = true
			if err := rows.Scan(&st.status, &st.attempts, &st.failedPosition, &st.nextAttemptAt, &st.now,
				&st.cursor.CommitKey, &st.cursor.Position); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	// Before the batch: see pendingSQL.
	b.Queue(pendingSQL, c.Name, c.instance).QueryRow(func(r pgx.Row) error { return r.Scan(&invisible) })
	b.Queue(batchSQL, c.Name, c.instance, limit).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			if recs == nil {
				recs = make([]eventstore.Record, 0, limit) // not on idle passes
			}
			var r eventstore.Record
			// The payload as *[]byte: pgx copies it, where a
			// *json.RawMessage would go through json.Unmarshal.
			if err := rows.Scan(&r.Position, &r.CommitKey, &r.TenantID, &r.StreamType, &r.StreamID, &r.Version,
				&r.Type, &r.TypeVersion, (*[]byte)(&r.Payload), &r.Metadata, &r.CreatedAt); err != nil {
				return err
			}
			recs = append(recs, r)
		}
		return rows.Err()
	})
	if err = conn.SendBatch(ctx, b).Close(); err != nil {
		return false, st, nil, false, fmt.Errorf("read batch: %w", err)
	}
	if !found {
		if c.instance == SharedInstance {
			// Registration made it; nothing but a repartition (or an
			// operator) removes a shared row.
			return locked, st, nil, false, fmt.Errorf("consumer %s/%s has %w: a process with another partition count of %s may have replaced the rows "+
				"(stop the processes that run the old count), or the row was removed", c.Name, c.instance, errNoStateRow, c.base)
		}
		return locked, st, nil, false, fmt.Errorf("consumer %s/%s has %w", c.Name, c.instance, errNoStateRow)
	}
	c.remember(st.cursor, st.status)
	return locked, st, recs, invisible, nil
}

// errNoStateRow marks a pass that found no state row for its consumer.
var errNoStateRow = errors.New("no state row")

// recreateSQL puts back a state row that was removed under a running
// process; a row that exists meanwhile (re-registered, or re-created by a
// concurrent pass) is kept.
const recreateSQL = `INSERT INTO event_consumers (name, instance_id, event_types, cursor_commit_key, cursor_position, status,
  partition_index, partition_count)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (name, instance_id) DO NOTHING`

// recreate puts back the state row of a per-instance consumer that another
// process removed while this one runs: the stale sweep removes the rows of
// an instance whose heartbeats did not reach the database for
// StaleInstanceAfter, which happens to a live process whose connections
// failed for that long. Without its row the consumer could never run
// again (its in-process state, such as the SSE hub, would silently stop
// receiving events until a restart). The row comes back at the cursor this
// process last read or committed, so no event is skipped and none applied
// twice (beyond the usual redelivery of a pass whose commit outcome was
// unknown), and disabled if it was; the attempts of a failing event start
// over. Events retention pruned meanwhile (the removed row no longer held
// them back) are gone. A process that never saw its row (not registered
// yet) registers it instead.
func (d *Dispatcher) recreate(ctx context.Context, c *consumerRun) error {
	k := c.knownRow()
	if !k.ok {
		if _, err := d.pool.Exec(ctx, registerSQL, c.Name, c.instance, c.EventTypes, c.StartAtHead, c.part, c.Partitions); err != nil {
			return fmt.Errorf("dispatcher: %s: register removed state row: %w", c.Name, err)
		}
		d.log.Warn("consumer state row re-created", "consumer", c.Name, "instance_id", c.instance, "cursor", "start")
		return nil
	}
	status := "idle"
	if k.disabled {
		status = "disabled"
	}
	tag, err := d.pool.Exec(ctx, recreateSQL, c.Name, c.instance, c.EventTypes, k.cursor.CommitKey, k.cursor.Position, status,
		c.part, c.Partitions)
	if err != nil {
		return fmt.Errorf("dispatcher: %s: re-create removed state row: %w", c.Name, err)
	}
	if tag.RowsAffected() > 0 {
		d.log.Warn("consumer state row re-created", "consumer", c.Name, "instance_id", c.instance,
			"cursor", k.cursor.String(), "status", status)
	}
	return nil
}

// pass runs one pass of c.
func (d *Dispatcher) pass(ctx context.Context, c *consumerRun) (passResult, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return passResult{}, fmt.Errorf("dispatcher: acquire: %w", err)
	}
	defer func() {
		if conn != nil {
			conn.Release()
		}
	}()
	res, fail, err := d.attempt(ctx, conn.Conn(), c, c.BatchSize, nil, false)
	if errors.Is(err, errNoStateRow) && c.instance != SharedInstance {
		// Removed under this running process (see recreate): put it back
		// and run the pass.
		if err := d.recreate(ctx, c); err != nil {
			return passResult{}, err
		}
		res, fail, err = d.attempt(ctx, conn.Conn(), c, c.BatchSize, nil, false)
	}
	if errors.Is(err, errQueueFailed) {
		// Which event's deferred statement failed is unknown: run the pass
		// again with statements sent at once.
		res, fail, err = d.followUp(ctx, &conn, c, c.BatchSize, nil)
	}
	if err == nil && fail != nil && fail.timedOut && fail.index == 0 && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The caller cancelled the pass during its first handler: nothing
		// to commit, and nothing failed.
		err = ctx.Err()
	}
	if err != nil || fail == nil {
		if err != nil {
			err = fmt.Errorf("dispatcher: %s: %w", c.Name, err)
		}
		return res, err
	}
	// An event failed and its pass was rolled back: re-run the pass up to
	// the event before it, recording the failure with the cursor. When an
	// event before it fails in the re-run (its deferred statement, which
	// the first attempt had not sent yet when a later handler returned an
	// error, runs at once now; or a handler that fails only sometimes), that
	// one is the failure: re-run up to it instead. Each round ends earlier
	// in the batch, so this stops.
	//
	// A failure the pass's deadline caused (see Config.PassTimeout) is no
	// failure of its event, unless that event was the first of the batch:
	// the re-run commits the events before it and records nothing.
	for {
		switch {
		case fail.lost && fail.victim:
			if n := c.noteVictim(fail.at.Position); n > VictimRetries {
				// The handler deadlocks (or conflicts) every time: its
				// event's failure, counted as an attempt (see VictimRetries).
				fail.lost = false
				fail.err = fmt.Errorf("deadlock or serialization victim %d times in a row at this event: %w", n, fail.err)
			}
		case !fail.lost:
			c.clearVictims()
		}
		if fail.timedOut && fail.index > 0 {
			d.log.Warn("consumer pass timed out; committing the events before", "consumer", c.Name, "instance_id", c.instance,
				"position", fail.at.Position, "pass_timeout", d.cfg.PassTimeout.String())
		} else if fail.lost {
			// Routine on a failover or under lock contention, and no
			// failure of the event: not in the failure counter, which
			// alerts watch, nor logged as one.
			d.metrics.lost.WithLabelValues(c.Name, c.instance).Inc()
			attrs := append([]any{"consumer", c.Name, "instance_id", c.instance, "position", fail.at.Position},
				eventAttrs(fail.typ, fail.tenant, fail.meta)...)
			d.log.Warn("consumer pass lost; retrying its event", append(attrs, "error", fail.err)...)
		} else {
			if fail.timedOut {
				fail.err = fmt.Errorf("handler outlasted the pass timeout: %w", fail.err)
			}
			d.metrics.failed.WithLabelValues(c.Name, c.instance).Inc()
			attrs := append([]any{"consumer", c.Name, "instance_id", c.instance, "position", fail.at.Position},
				eventAttrs(fail.typ, fail.tenant, fail.meta)...)
			attrs = append(attrs, "error", fail.err)
			if pe, ok := errors.AsType[*panicError](fail.err); ok {
				attrs = append(attrs, "stack", string(pe.stack))
			}
			d.log.Warn("consumer event failed", attrs...)
		}
		var earlier *failure
		res, earlier, err = d.followUp(ctx, &conn, c, fail.index+1, fail)
		if err != nil || earlier == nil {
			break
		}
		fail = earlier
	}
	if err != nil {
		err = fmt.Errorf("dispatcher: %s: record failure: %w", c.Name, err)
	}
	return res, err
}

// followUp runs an attempt of the pass after its first one, in direct
// mode, on a context of its own: the first attempt may have used up the
// pass's time (the deadline cut a handler short), and the events it
// handled before still commit. A statement cancelled by the deadline may
// have closed the pass's connection: then it takes a new one.
func (d *Dispatcher) followUp(ctx context.Context, conn **pgxpool.Conn, c *consumerRun, limit int, f *failure) (passResult, *failure, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.PassTimeout)
	defer cancel()
	if (*conn).Conn().IsClosed() {
		(*conn).Release()
		*conn = nil
		nc, err := d.pool.Acquire(ctx)
		if err != nil {
			return passResult{}, nil, fmt.Errorf("acquire: %w", err)
		}
		*conn = nc
	}
	return d.attempt(ctx, (*conn).Conn(), c, limit, f, true)
}

// failure is an event that failed in an earlier attempt of this pass.
type failure struct {
	// index is the event's index in the attempt's batch.
	index int
	err   error
	// at is the failed event's cursor, from the consumer's cursor when the
	// attempt read its batch. The attempt's rollback releases the lock, so
	// another process's pass or an ops verb (skip, rewind) may move the
	// cursor before the re-run takes it again: the re-run records the
	// failure only if both are unchanged, never against an event that did
	// not fail.
	at, from eventstore.Cursor
	// timedOut is set when the attempt's context had ended when the event
	// failed: the deadline, not the event, may be the cause.
	timedOut bool
	// lost is set when the pass, not the event, failed (see passLost):
	// the event is retried like a transient failure.
	lost bool
	// victim is set with lost when the database picked the pass's
	// transaction as a deadlock or serialization victim (see
	// VictimRetries).
	victim bool
	// typ, tenant and meta are the failed event's type, tenant and
	// metadata, for the log.
	typ, tenant string
	meta        eventstore.Metadata
}

// eventAttrs are the log attributes that tie a consumer's failure to the
// event's cause: its type, tenant, and the correlation and causation ids
// it was appended with (for a write, the request's correlation id and its
// request id), as the job runner logs them for a run.
func eventAttrs(typ, tenant string, meta eventstore.Metadata) []any {
	return []any{"event_type", typ, "tenant_id", tenant,
		"correlation_id", meta.CorrelationID, "causation_id", meta.CausationID}
}

// attempt runs one pass transaction. Without f it applies up to limit
// events and, when one fails, rolls back and returns the failure. With f
// it applies the events before f.index and records the failure, or gives
// up the pass (recording nothing) when the batch is no longer the one
// that failed; when an event before f.index fails, it rolls back and
// returns that failure. In direct mode statements deferred with framework.Tx.Queue
// are sent at once; otherwise a failing deferred statement returns
// errQueueFailed.
func (d *Dispatcher) attempt(ctx context.Context, conn *pgx.Conn, c *consumerRun, limit int, f *failure, direct bool) (res passResult, fail *failure, err error) {
	committed := false
	defer func() {
		if !committed {
			rollbackConn(conn)
		}
	}()
	locked, st, recs, invisible, err := d.begin(ctx, conn, c, limit)
	if err != nil {
		return res, nil, err
	}
	res.invisible = invisible
	if !locked {
		res.skipped = true
		return res, nil, nil
	}
	if st.status != "idle" {
		return res, nil, nil
	}
	if st.nextAttemptAt != nil && st.nextAttemptAt.After(st.now) {
		res.retryAt = time.Now().Add(st.nextAttemptAt.Sub(st.now))
		return res, nil, nil
	}
	if len(recs) == 0 {
		return res, nil, nil // an idle pass writes nothing
	}
	apply := recs
	if f != nil {
		if st.cursor != f.from || len(recs) <= f.index || recs[f.index].Cursor() != f.at {
			// The cursor moved while the lock was free: this is not the
			// batch that failed. The next pass sees it afresh.
			res.full = true
			return res, nil, nil
		}
		apply = recs[:f.index]
	}
	// The transaction is switched to an event's tenant when its handler
	// sends the first statement (see scopedConn).
	sc := &scopes{conn: conn, applied: tenancy.SystemTenantID, direct: direct}
	written := 0
	var tx *framework.Tx
	cut := false // the deadline stopped the pass before the end of apply
	for i, env := range apply {
		if ctx.Err() != nil {
			if i == 0 {
				return res, nil, fmt.Errorf("no time left for the first event: %w", ctx.Err())
			}
			// Out of time: commit the events handled so far.
			apply, cut = apply[:i], true
			break
		}
		want := tenancy.SystemTenantID
		if !c.System {
			want = env.TenantID
		}
		tx = framework.ReuseEventTx(tx, sc.db(want), d.reg, env)
		aerr := applyAndFlush(ctx, c.Apply, tx, env)
		sc.settle()
		if sc.queueErr != nil {
			if ctx.Err() == nil {
				return res, nil, sc.queueErr
			}
			// The deadline cut a send of deferred statements short: the
			// re-run sends them at once.
			aerr = sc.queueErr
		}
		if aerr != nil {
			timedOut := ctx.Err() != nil
			lost := !timedOut && passLost(conn, aerr)
			return res, &failure{index: i, err: aerr, at: env.Cursor(), from: st.cursor, timedOut: timedOut,
				lost: lost, victim: lost && victim(aerr), typ: env.Type, tenant: env.TenantID, meta: env.Metadata}, nil
		}
		written += tx.Written()
	}
	if cut || f != nil && f.timedOut && f.index > 0 {
		// The deadline cut the pass short: commit the events handled,
		// recording no failure, and go on at once.
		f = nil
		res.full = true
	}
	// What the handlers did commits even when they used up the pass's
	// time: the commit gets a context of its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.PassTimeout)
	defer cancel()
	if c.BeforeCommit != nil && len(apply) > 0 {
		err := c.BeforeCommit(ctx, sc.db(sc.want))
		sc.settle()
		if sc.queueErr != nil {
			return res, nil, sc.queueErr
		}
		if err != nil {
			return res, nil, fmt.Errorf("before commit: %w", err)
		}
	}
	b := &pgx.Batch{}
	deferred := len(sc.queue)
	if scope := sc.queueDeferred(b, sc.applied); scope != tenancy.SystemTenantID {
		tenancy.QueueScope(b, tenancy.SystemTenantID)
	}
	cur := eventstore.Cursor{}
	if len(apply) > 0 {
		cur = apply[len(apply)-1].Cursor()
	}
	// An event of a newer schema version than this code declares is the
	// newer release's to handle: it waits for that code (the cursor stays,
	// no attempt is counted, nothing is dead-lettered) rather than killing
	// the consumer or being skipped past for good.
	// So is an event whose pass was lost under it (see passLost): it did
	// nothing wrong, and neither counts an attempt nor is dead-lettered.
	transient := f != nil && (f.lost || errors.Is(f.err, framework.ErrNewerEventVersion) || c.Transient != nil && c.Transient(f.err))
	moved := true // the commit moves the cursor to cur
	switch {
	case f == nil:
		b.Queue(advanceSQL, c.Name, c.instance, cur.CommitKey, cur.Position, len(apply))
	case c.SkipApplyErrors && !transient:
		bad := recs[f.index]
		b.Queue(deadLetterSQL, c.Name, c.instance, bad.Position, bad.Type, bad.TenantID, storable(f.err.Error()))
		cur = bad.Cursor()
		b.Queue(advanceSQL, c.Name, c.instance, cur.CommitKey, cur.Position, len(apply))
	default:
		moved = len(apply) > 0
		bad := recs[f.index]
		attempts := 1
		if st.failedPosition != nil && *st.failedPosition == bad.Position {
			attempts = st.attempts + 1
		}
		backoffN := attempts
		if transient {
			// A transient failure is retried but not counted: the consumer
			// never turns dead for it.
			attempts--
			backoffN = int(c.transientStreak.Add(1))
		}
		dead := !transient && attempts >= c.MaxAttempts
		delay := d.backoff(backoffN)
		res.retryAt = time.Now().Add(delay)
		lastError := f.err.Error()
		if f.lost {
			lastError = PassLost + ": " + lastError
		}
		if len(apply) == 0 {
			// The cursor stays where it is.
			b.Queue(`UPDATE event_consumers SET attempts = $3, failed_position = $4, last_error = $5,
  next_attempt_at = now() + $6::interval,
  status = CASE WHEN $7 THEN 'dead' ELSE status END,
  dead_at = CASE WHEN $7 THEN now() ELSE dead_at END, updated_at = now()
WHERE name = $1 AND instance_id = $2`, c.Name, c.instance, attempts, bad.Position, truncate(lastError), delay, dead)
		} else {
			b.Queue(failSQL, c.Name, c.instance, cur.CommitKey, cur.Position, len(apply), attempts, bad.Position, truncate(lastError), delay, dead)
		}
		if dead {
			attrs := append([]any{"consumer", c.Name, "instance_id", c.instance, "position", bad.Position},
				eventAttrs(bad.Type, bad.TenantID, bad.Metadata)...)
			d.log.Error("consumer dead", append(attrs, "attempts", attempts, "error", f.err)...)
		}
	}
	b.Queue(`COMMIT`)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		if deferred > 0 {
			return res, nil, fmt.Errorf("%w: %w", errQueueFailed, err)
		}
		return res, nil, fmt.Errorf("commit pass: %w", err)
	}
	committed = true
	if moved {
		c.remember(cur, "")
	}
	if f == nil {
		c.transientStreak.Store(0)
		c.clearVictims()
	}
	res.delivered = len(apply)
	res.full = res.full || f == nil && len(recs) >= limit
	if f != nil && c.SkipApplyErrors && !transient {
		res.full = true // move on at once
	}
	d.metrics.processed.WithLabelValues(c.Name, c.instance).Add(float64(len(apply)))
	if written > 0 {
		d.Wake()
	}
	return res, nil, nil
}

// PassLost starts the last error a state row records for a pass lost under
// its event's handler (see the README's Failures): the event is retried
// without counting an attempt.
const PassLost = "pass lost, retried without counting an attempt"

// VictimRetries bounds how often in a row a pass may be lost as a deadlock
// or serialization victim (40P01, 40001) at the same event without
// counting an attempt: from the next such loss on, each counts as the
// event's failure (attempts, backoff, dead at MaxAttempts, a dead letter
// with SkipApplyErrors), so that a handler that deadlocks every time, by
// its own making, does not retry its event for ever. Lock contention with
// other transactions seldom makes the same event the victim that often in
// a row. Each process counts its own passes, and a delivery, or any other
// failure in between, starts the count over; a pass lost because its
// connection ended (a killed backend, a restart, a failover) is never
// counted, nor does it start the count over.
const VictimRetries = 5

// victim reports whether err is the database's choice of the pass's
// transaction as a deadlock (40P01) or serialization (40001) victim.
func victim(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// passLost reports whether err, the failure of an event's handler in a
// pass on conn, is the pass's rather than the event's: the database ended
// the connection (pg_terminate_backend, a restart, a failover), or chose
// the pass's transaction as the victim of a deadlock (40P01) or a
// serialization failure (40001). The handler's writes are rolled back
// either way; running the event again is the remedy, so it must neither
// count toward MaxAttempts nor be dead-lettered by SkipApplyErrors, which
// would lose its effect for good. A session the server ended because the
// pass idled in its transaction for longer than
// idle_in_transaction_session_timeout (25P03) is the handler's: it counts.
// Whether the connection ended is asked of the connection, not read from
// err: a handler's own error that looks like a lost connection (an
// io.ErrUnexpectedEOF of a decoder, a net.Error of a service it called)
// while the pass's connection is fine is the event's failure.
func passLost(conn *pgx.Conn, err error) bool {
	if victim(err) {
		return true
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "25P03" {
		return false
	}
	// pgx closes the connection on every error that ends it (a network
	// error, EOF, a FATAL of the server), unless a deadline of the
	// handler's own closed it.
	return conn.IsClosed() && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// panicError is a panic of a consumer's Apply or BeforeCommit, recovered
// so that it fails the event (or the pass) like an error instead of
// ending the process: every consumer of an all-in-one process, and its
// API, would stop, and after a restart the same event would panic again.
type panicError struct {
	value any
	stack []byte
}

func (p *panicError) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// Unwrap returns the panic value when it is an error.
func (p *panicError) Unwrap() error {
	err, _ := p.value.(error)
	return err
}

// applyAndFlush runs apply and writes the events it appended, which runs
// their inline projections; a panic in either (an inline projection's too)
// fails the event as a *panicError.
func applyAndFlush(ctx context.Context, apply func(context.Context, *framework.Tx, framework.Envelope) error, tx *framework.Tx, env framework.Envelope) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	if err := apply(ctx, tx, env); err != nil {
		return err
	}
	if tx.HasPending() {
		_, err = tx.Flush(ctx)
	}
	return err
}

// recoverBeforeCommit returns hook with a panic turned into a *panicError.
func recoverBeforeCommit(hook func(context.Context, framework.DB) error) func(context.Context, framework.DB) error {
	if hook == nil {
		return nil
	}
	return func(ctx context.Context, db framework.DB) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = &panicError{value: v, stack: debug.Stack()}
			}
		}()
		return hook(ctx, db)
	}
}

// backoff returns the delay before attempt n+1.
func (d *Dispatcher) backoff(attempts int) time.Duration {
	delay := d.cfg.RetryBaseDelay
	for i := 1; i < attempts && delay < d.cfg.RetryMaxDelay; i++ {
		delay *= 2
	}
	return min(delay, d.cfg.RetryMaxDelay)
}

// maxLastError bounds the error text a state row keeps (last_error).
const maxLastError = 2000

// truncate returns the storable form of s (see storable), cut to at most
// maxLastError bytes at a character boundary.
func truncate(s string) string {
	s = storable(s)
	if len(s) <= maxLastError {
		return s
	}
	cut := maxLastError
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// storable returns s as Postgres can store it in a text column: invalid
// UTF-8 and NUL bytes, which it refuses, are replaced with U+FFFD. A
// handler's error may quote raw bytes; were it refused, the statement that
// records the failure would fail the pass before it counted an attempt,
// and the consumer would retry the event forever.
func storable(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// rollbackConn ends a pass transaction that did not commit.
func rollbackConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
		_ = c.Close(ctx)
	}
}
