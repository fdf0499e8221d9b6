package dispatcher

import "context"

// Revive runs one revival sweep (the maintenance loop does it every
// second).
func (d *Dispatcher) Revive(ctx context.Context) { d.revive(ctx) }

// Heartbeat runs one heartbeat: touch own rows, delete stale ones, measure.
func (d *Dispatcher) Heartbeat(ctx context.Context) { d.heartbeat(ctx) }
