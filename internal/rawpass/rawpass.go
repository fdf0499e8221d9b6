// Package rawpass is the baseline of the dispatcher's benchmarks: one
// dispatcher pass (the lock, the read below the visibility horizon and the
// checkpoint, in one transaction) written against pgx directly, with none
// of the framework's per-event work. cmd/kumiko-bench's dispatcher-catchup
// and framework/dispatcher's BenchmarkRunOnce measure the framework
// against it.
package rawpass

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	lockSQL = `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`
	readSQL = `SELECT e.position, e.commit_key, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type, e.type_version, e.payload, e.metadata, e.created_at
FROM event_consumers c
JOIN LATERAL (
  SELECT * FROM events
  WHERE (commit_key, position) > (c.cursor_commit_key, c.cursor_position)
    AND commit_key < pg_snapshot_xmin(pg_current_snapshot())
  ORDER BY commit_key, position
  LIMIT $2
) e ON true
WHERE c.name = $1 AND c.instance_id = '__shared__'
ORDER BY e.commit_key, e.position`
	advanceSQL = `UPDATE event_consumers SET cursor_commit_key = $2, cursor_position = $3, updated_at = now()
WHERE name = $1 AND instance_id = '__shared__'`
	// RewindSQL puts the shared state row $1 back at the start of the log.
	RewindSQL = `UPDATE event_consumers SET cursor_commit_key = '0', cursor_position = 0 WHERE name = $1`
	// RegisterSQL creates the shared state row $1 at the start of the log,
	// or puts an existing one back there.
	RegisterSQL = `INSERT INTO event_consumers (name, instance_id) VALUES ($1, '__shared__')
ON CONFLICT (name, instance_id) DO UPDATE SET cursor_commit_key = '0', cursor_position = 0`
)

// row is what a raw pass decodes of each event: every column, JSON left
// as bytes.
type row struct {
	position, version int64
	commitKey         uint64
	tenant, typ       string
	streamType, id    string
	typeVersion       int
	payload, metadata []byte
	createdAt         time.Time
}

// Pass runs one raw pass of the shared state row name on conn: BEGIN, the
// lock and the read of up to limit events pipelined in one round trip, the
// checkpoint and COMMIT in a second. It returns the number of events read;
// 0 when the lock was held elsewhere or nothing was left (the transaction
// is then rolled back).
func Pass(ctx context.Context, conn *pgx.Conn, name string, limit int) (int, error) {
	var locked bool
	rows := make([]row, 0, limit)
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(lockSQL, name+"\x1f__shared__").QueryRow(func(r pgx.Row) error { return r.Scan(&locked) })
	b.Queue(readSQL, name, limit).Query(func(rs pgx.Rows) error {
		for rs.Next() {
			var r row
			if err := rs.Scan(&r.position, &r.commitKey, &r.tenant, &r.streamType, &r.id, &r.version,
				&r.typ, &r.typeVersion, &r.payload, &r.metadata, &r.createdAt); err != nil {
				return err
			}
			rows = append(rows, r)
		}
		return rs.Err()
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return 0, err
	}
	if !locked || len(rows) == 0 {
		_, err := conn.Exec(ctx, `ROLLBACK`)
		return 0, err
	}
	last := rows[len(rows)-1]
	b = &pgx.Batch{}
	b.Queue(advanceSQL, name, last.commitKey, last.position)
	b.Queue(`COMMIT`)
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return 0, err
	}
	return len(rows), nil
}
