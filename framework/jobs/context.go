package jobs

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumiko-go/kumiko/framework"
)

// Context describes one run of a job and gives it the framework: a
// tenant-scoped transaction ([Context.InTx]) and dispatch of other jobs.
type Context struct {
	// Job is the qualified job name.
	Job string
	// TaskID is the run's asynq task id (derived from the trigger).
	TaskID string
	// Lane is the lane the run was consumed from.
	Lane framework.RunIn
	// TenantID owns the run; InTx is scoped to it (framework.SystemTenantID
	// for cron jobs: unrestricted).
	TenantID string
	// UserID is the user whose write caused the run ("" for system work).
	UserID string
	// CorrelationID ties the run to what caused it: the triggering event's
	// correlation id, the dispatching transaction's, or the task id for
	// cron runs.
	CorrelationID string
	// CausationID is the id of what triggered the run: the event's position
	// for event jobs and transactional dispatches, the dispatcher's
	// CausationID for direct ones, "" for cron runs.
	CausationID string
	// Retry counts the earlier failed runs of this task (0 on the first).
	Retry int
	// MaxRetry is the run's retry limit: the job's, or the lower one the
	// run was enqueued with (by a release before the limit was raised).
	MaxRetry int

	rt       *framework.Runtime
	client   *Client
	children *children
	// txSlots bounds the runner's runs inside InTx (nil: no bound).
	txSlots chan struct{}
	// run is the run's id (its headerRun), the same in every attempt.
	run string
	// runCtx ends when the run does (its Timeout passed, its handler
	// returned, the runner shut down): it bounds InTx whatever context the
	// handler passes (nil: no bound).
	runCtx context.Context
}

// children counts an attempt's unkeyed [Context.Dispatch] calls per job
// name. It is shared by pointer, so that copies of a Context count
// together.
type children struct {
	mu sync.Mutex
	n  map[string]int
}

// next returns the number of the next dispatch of job, from 1.
func (c *children) next(job string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[job]++
	return c.n[job]
}

// InTx runs fn in a transaction scoped to the run's tenant (row-level
// security confines it as it does write handlers) and commits it. Events fn
// appends carry the run's correlation id and its causation id (the task id
// when the run has none, as cron runs).
// Put the run's database writes and its [HandledOnce] claim in one InTx,
// and do not nest InTx calls. With [Config].MaxTransactions set, InTx
// first waits (as long as ctx allows) until fewer runs than that are in
// one.
//
// The transaction lives no longer than the run, whatever ctx is (also a
// context.WithoutCancel one): once the run has ended (its Timeout passed
// and the run failed, or its handler returned) InTx fails, and a
// transaction still open then is rolled back. A handler abandoned after
// its Timeout commits nothing behind its failed run, which is retried or
// archived.
func (c *Context) InTx(ctx context.Context, fn func(ctx context.Context, tx *framework.Tx) error) error {
	if c.rt == nil {
		return fmt.Errorf("jobs: %s: no runtime to open a transaction", c.Job)
	}
	if c.runCtx != nil {
		if err := c.runCtx.Err(); err != nil {
			return fmt.Errorf("jobs: %s: the run has ended: %w", c.Job, err)
		}
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(c.runCtx, func() {
			cancel(fmt.Errorf("jobs: %s: the run has ended: %w", c.Job, c.runCtx.Err()))
		})
		defer stop()
	}
	if c.txSlots != nil {
		select {
		case c.txSlots <- struct{}{}:
			defer func() { <-c.txSlots }()
		case <-ctx.Done():
			return fmt.Errorf("jobs: %s: waiting for a transaction slot: %w", c.Job, ctx.Err())
		}
	}
	meta := framework.Metadata{UserID: c.UserID, CorrelationID: c.CorrelationID, CausationID: cmp.Or(c.CausationID, c.TaskID)}
	_, err := c.rt.InTx(ctx, c.TenantID, meta, fn)
	return err
}

// Dispatch enqueues the manual job name for the run's tenant, carrying the
// run's correlation id; the run's task id is the new run's causation id.
// See [Client.Dispatch].
//
// A retried run does not dispatch its children twice. asynq delivers a run
// at least once: an attempt that dispatched and then failed, or whose
// worker died before asynq recorded its success, runs again under the same
// task id. Without a Key, the n-th dispatch of job name in an attempt gets
// the task id "<name>@child-<hash of the run's task id, run id and n>",
// the same in every attempt of the run; when the id is taken the child was
// dispatched by an earlier attempt, and Dispatch returns its id and no
// error. The run id is drawn when a derived task id is enqueued, so a new
// run under an earlier run's id (a keyed dispatch after its window, a
// rewound trigger) dispatches new children, even while the earlier run's
// are still kept (archived, or retained after finishing later). This
// assumes the handler is deterministic: each attempt dispatches the same
// children of a job in the same order. When it is not (the children come
// from data that may change between attempts, or are dispatched from
// several goroutines), pass a Key that names the child (an item's id):
// the Key then derives the id instead, as for [Client.Dispatch]. A taken
// key is no error either when this run dispatched it (in an earlier
// attempt, or earlier in this one: the child records the run that
// dispatched it): Dispatch returns its id and nil. A key taken by
// another run (another parent, a [Client.Dispatch], an earlier run under
// a reused task id) is [ErrDuplicate].
//
// The guarantee lasts as long as asynq keeps the child: while it waits,
// runs or waits to be retried, while it is archived (asynq drops archived
// runs after 90 days, or the oldest beyond 10,000 per queue), and for
// Config.DedupRetention (24 hours by default) after it succeeded. An
// attempt later than that (an archived parent retried by an operator days
// later, a Backoff of a day) dispatches it again; guard effects that must
// not repeat with [HandledOnce]. A Unique child refused because an equal
// run holds its window is [ErrDuplicate].
func (c *Context) Dispatch(ctx context.Context, name string, payload any, opts *DispatchOptions) (string, error) {
	o := DispatchOptions{}
	if opts != nil {
		o = *opts
	}
	o.TenantID = cmp.Or(o.TenantID, c.TenantID)
	o.CorrelationID = cmp.Or(o.CorrelationID, c.CorrelationID)
	o.CausationID = cmp.Or(o.CausationID, c.TaskID)
	var parent, childID string
	if c.TaskID != "" {
		parent = parentRun(c.TaskID, c.run)
		if o.Key == "" && c.children != nil {
			childID = childTaskID(name, c.TaskID, c.run, c.children.next(name))
		}
	}
	return c.client.dispatch(ctx, name, payload, &o, parent, childID)
}

const handledSQL = `INSERT INTO handled (tenant_id, key) VALUES ($1, $2) ON CONFLICT DO NOTHING`

// handledLongSQL claims a long key by its hash ($2) unless the key itself
// ($3) was claimed: releases before the hashing stored keys up to a btree
// entry's limit as they are, and those claims still hold.
const handledLongSQL = `INSERT INTO handled (tenant_id, key)
SELECT $1, $2 WHERE NOT EXISTS (SELECT 1 FROM handled WHERE tenant_id = $1 AND key = $3)
ON CONFLICT DO NOTHING`

// MaxHandledKeyLength is the longest key [HandledOnce] keeps as it is;
// longer ones are kept by their hash.
const MaxHandledKeyLength = 512

// HandledOnce claims key in the handled table inside tx and reports whether
// this is the first claim. Call it in the same transaction as the job's
// database writes and run the guarded effect only when it returns true: the
// claim commits with the writes or rolls back with them, so however often
// the job is delivered (retries, concurrent duplicates) the effect happens
// once. A concurrent claim of the same key waits for the first transaction
// and sees false once it commits (true if it rolled back). Keys are per
// tenant; prefix them with the job's purpose ("invoice:<order id>").
//
// An external effect that cannot join the transaction (an HTTP call) still
// has a window: if the process dies after the effect and before the commit,
// the claim rolls back and the effect repeats. Make such effects idempotent
// on the key at the receiver where possible.
//
// A key longer than [MaxHandledKeyLength] bytes is kept by its SHA-256
// ("sha256:" and 64 hex digits): a btree entry holds about 2.7 KB. A claim
// of such a key stored as it is (by a release before the hashing) still
// counts.
func HandledOnce(ctx context.Context, tx *framework.Tx, key string) (bool, error) {
	if key == "" {
		return false, fmt.Errorf("jobs: HandledOnce: empty key")
	}
	sql, args := handledSQL, []any{tx.TenantID(), key}
	if len(key) > MaxHandledKeyLength {
		sum := sha256.Sum256([]byte(key))
		sql, args = handledLongSQL, []any{tx.TenantID(), "sha256:" + hex.EncodeToString(sum[:]), key}
	}
	tag, err := tx.Exec(ctx, sql, args...)
	if err != nil {
		return false, fmt.Errorf("jobs: claim %q: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}

// MaxHandledAgeDays bounds the olderThanDays of [PruneHandled] (about
// 2,700 years; more reaches before the earliest time Postgres can hold).
const MaxHandledAgeDays = 1_000_000

// ErrBadAge is returned by [PruneHandled] for olderThanDays below 1 or
// above [MaxHandledAgeDays].
var ErrBadAge = fmt.Errorf("jobs: older-than-days must be between 1 and %d", MaxHandledAgeDays)

const pruneHandledSQL = `DELETE FROM handled WHERE handled_at < now() - make_interval(days => $1)`

// PruneHandled deletes the [HandledOnce] claims of every tenant made more
// than olderThanDays days ago and returns how many it deleted. Nothing
// else removes them: the handled table grows by one row per claim.
//
// A pruned key can be claimed again, so an effect it guarded repeats if
// its job is delivered once more after the prune. Keep claims for longer
// than a run can still come back: asynq keeps archived runs, which an
// operator may retry, for up to 90 days, so prune with 90 days or more
// unless no job is ever retried that late. The delete runs as the pool's
// user (the database owner; the tenant role sees one tenant's claims).
// It returns [ErrBadAge] for olderThanDays out of range.
func PruneHandled(ctx context.Context, pool *pgxpool.Pool, olderThanDays int) (int64, error) {
	if olderThanDays < 1 || olderThanDays > MaxHandledAgeDays {
		return 0, ErrBadAge
	}
	tag, err := pool.Exec(ctx, pruneHandledSQL, olderThanDays)
	if err != nil {
		return 0, fmt.Errorf("jobs: prune handled: %w", err)
	}
	return tag.RowsAffected(), nil
}
