package dispatcher

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Revive runs one revival sweep (the maintenance loop does it every
// second).
func (d *Dispatcher) Revive(ctx context.Context) { d.revive(ctx) }

// Heartbeat runs one heartbeat: touch own rows, delete stale ones, measure.
func (d *Dispatcher) Heartbeat(ctx context.Context) { d.heartbeat(ctx) }

// PassPending runs one pass of the named consumer and reports whether it
// saw events of its share of the log waiting above the horizon.
func (d *Dispatcher) PassPending(ctx context.Context, name string) (bool, error) {
	res, err := d.pass(ctx, d.byName[name])
	return res.invisible, err
}

// ListWithLagCap is List with the lag counted up to lagCap.
func ListWithLagCap(ctx context.Context, pool *pgxpool.Pool, lagCap int64) ([]ConsumerStatus, error) {
	return queryStatus(ctx, pool, nil, "", lagCap)
}

// SetOpsLockTimeout makes the ops verbs wait at most d for a lock until
// the test ends (tests that set it must not run in parallel).
func SetOpsLockTimeout(t interface{ Cleanup(func()) }, d time.Duration) {
	old := opsLockTimeout.Swap(int64(d))
	t.Cleanup(func() { opsLockTimeout.Store(old) })
}

// PassOutcome runs one pass of the named consumer and reports how many
// events it delivered and whether it saw events of its share of the log
// waiting above the horizon.
func (d *Dispatcher) PassOutcome(ctx context.Context, name string) (delivered int, pending bool, err error) {
	res, err := d.pass(ctx, d.byName[name])
	return res.delivered, res.invisible, err
}
