package dispatcher

import (
	"context"
	"time"
)

const (
	heartbeatSQL = `UPDATE event_consumers SET heartbeat_at = now() WHERE instance_id = $1`
	// staleSQL removes per-instance rows of processes silent for too long,
	// so they neither pin retention nor show false lag.
	staleSQL  = `DELETE FROM event_consumers WHERE instance_id <> '__shared__' AND heartbeat_at < now() - $1::interval`
	reviveSQL = `UPDATE event_consumers SET status = 'idle', attempts = 0, next_attempt_at = NULL,
  dead_at = NULL, revivals = revivals + 1, updated_at = now()
WHERE status = 'dead' AND dead_at <= now() - $1::interval AND revivals < $2
  AND name = ANY($3) AND instance_id = ANY($4)
RETURNING name, instance_id`
	lagSQL = `SELECT count(*) FROM (
  SELECT 1 FROM events e, event_consumers c
  WHERE c.name = $1 AND c.instance_id = $2
    AND (e.commit_key, e.position) > (c.cursor_commit_key, c.cursor_position)
    AND (c.event_types IS NULL OR e.type = ANY(c.event_types))
    AND (c.partition_count = 1 OR kumiko_stream_partition(e.stream_id, c.partition_count) = c.partition_index)
  LIMIT 10000000) x`
	visibilitySQL = `SELECT coalesce(extract(epoch FROM now() - min(xact_start)), 0)::float8
FROM pg_stat_activity WHERE backend_xid IS NOT NULL`
)

// maintenanceLoop beats the heartbeat, removes stale instance rows, revives
// dead consumers after the cooldown and refreshes the lag gauges.
func (d *Dispatcher) maintenanceLoop(ctx context.Context) {
	tick := time.NewTicker(min(d.cfg.HeartbeatInterval, time.Second))
	defer tick.Stop()
	lastBeat := time.Time{}
	for {
		if time.Since(lastBeat) >= d.cfg.HeartbeatInterval {
			d.heartbeat(ctx)
			lastBeat = time.Now()
		}
		d.revive(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// heartbeat touches this instance's rows, deletes stale ones and measures lag.
func (d *Dispatcher) heartbeat(ctx context.Context) {
	if _, err := d.pool.Exec(ctx, heartbeatSQL, d.cfg.InstanceID); err != nil && ctx.Err() == nil {
		d.log.Warn("dispatcher heartbeat failed", "error", err)
	}
	if tag, err := d.pool.Exec(ctx, staleSQL, d.cfg.StaleInstanceAfter); err == nil && tag.RowsAffected() > 0 {
		d.log.Info("removed stale per-instance consumer rows", "rows", tag.RowsAffected())
	}
	d.measure(ctx)
}

// measure refreshes the lag and visibility gauges.
func (d *Dispatcher) measure(ctx context.Context) {
	for _, c := range d.consumers {
		var lag int64
		if err := d.pool.QueryRow(ctx, lagSQL, c.Name, c.instance).Scan(&lag); err == nil {
			d.metrics.lag.WithLabelValues(c.Name, c.instance).Set(float64(lag))
		}
	}
	var secs float64
	if err := d.pool.QueryRow(ctx, visibilitySQL).Scan(&secs); err == nil {
		d.metrics.visibility.Set(secs)
	}
}

// revive brings dead consumers back after the cooldown, at most
// MaxRevivals times in a row.
func (d *Dispatcher) revive(ctx context.Context) {
	names := make([]string, len(d.consumers))
	insts := make([]string, len(d.consumers))
	for i, c := range d.consumers {
		names[i], insts[i] = c.Name, c.instance
	}
	rows, err := d.pool.Query(ctx, reviveSQL, d.cfg.ReviveCooldown, d.cfg.MaxRevivals, names, insts)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name, inst string
		if rows.Scan(&name, &inst) == nil {
			d.log.Info("consumer revived", "consumer", name, "instance_id", inst)
			if c := d.byName[name]; c != nil {
				select {
				case c.wake <- struct{}{}:
				default:
				}
			}
		}
	}
}
