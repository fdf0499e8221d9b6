package jobs

import (
	"cmp"
	"context"
	"fmt"

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
	// MaxRetry is the job's retry limit.
	MaxRetry int

	rt     *framework.Runtime
	client *Client
}

// InTx runs fn in a transaction scoped to the run's tenant (row-level
// security confines it as it does write handlers) and commits it. Events fn
// appends carry the run's correlation id and its causation id (the task id
// when the run has none, as cron runs).
// Put the run's database writes and its [HandledOnce] claim in one InTx.
func (c *Context) InTx(ctx context.Context, fn func(ctx context.Context, tx *framework.Tx) error) error {
	if c.rt == nil {
		return fmt.Errorf("jobs: %s: no runtime to open a transaction", c.Job)
	}
	meta := framework.Metadata{UserID: c.UserID, CorrelationID: c.CorrelationID, CausationID: cmp.Or(c.CausationID, c.TaskID)}
	_, err := c.rt.InTx(ctx, c.TenantID, meta, fn)
	return err
}

// Dispatch enqueues the manual job name for the run's tenant, carrying the
// run's correlation id; the run's task id is the new run's causation id.
// See [Client.Dispatch].
func (c *Context) Dispatch(ctx context.Context, name string, payload any, opts *DispatchOptions) (string, error) {
	o := DispatchOptions{}
	if opts != nil {
		o = *opts
	}
	o.TenantID = cmp.Or(o.TenantID, c.TenantID)
	o.CorrelationID = cmp.Or(o.CorrelationID, c.CorrelationID)
	o.CausationID = cmp.Or(o.CausationID, c.TaskID)
	return c.client.Dispatch(ctx, name, payload, &o)
}

const handledSQL = `INSERT INTO handled (tenant_id, key) VALUES ($1, $2) ON CONFLICT DO NOTHING`

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
func HandledOnce(ctx context.Context, tx *framework.Tx, key string) (bool, error) {
	if key == "" {
		return false, fmt.Errorf("jobs: HandledOnce: empty key")
	}
	tag, err := tx.Exec(ctx, handledSQL, tx.TenantID(), key)
	if err != nil {
		return false, fmt.Errorf("jobs: claim %q: %w", key, err)
	}
	return tag.RowsAffected() == 1, nil
}
