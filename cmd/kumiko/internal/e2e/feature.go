// Package e2e is the test-only feature of the kumiko binary's multi-process
// tests (cmd/kumiko/internal/e2e/kumiko-e2e is the kumiko binary with this
// feature added). Its projections record every delivery in tables a test
// can count:
//
//   - e2e:tally (shared) inserts (position, instance_id) per event, with
//     no unique key, so a duplicate delivery shows as a second row;
//   - e2e:local (per-instance) inserts (instance_id, position) per event
//     in every process that runs it;
//   - e2e:streams (shared, in four partitions) folds each stream into one
//     row (event count, last version, sum of the payloads' sequence
//     numbers) and counts versions that arrive out of order.
package e2e

import (
	"context"
	"time"

	"github.com/kumiko-go/kumiko/framework"
)

// Ticked is the payload of e2e:event:ticked.
type Ticked struct {
	// Writer is the writer goroutine that appended the event.
	Writer int `json:"writer"`
	// Seq is a number summed per stream by e2e:streams.
	Seq int64 `json:"seq"`
}

// Schema creates the feature's tables; tests run it on a fresh database
// before they start the processes.
const Schema = `
CREATE TABLE e2e_tally (tenant_id text NOT NULL, position bigint NOT NULL, instance_id text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
SELECT kumiko_enable_tenancy('e2e_tally');
CREATE TABLE e2e_local (tenant_id text NOT NULL, instance_id text NOT NULL, position bigint NOT NULL);
SELECT kumiko_enable_tenancy('e2e_local');
CREATE TABLE e2e_streams (tenant_id text NOT NULL, stream_id text NOT NULL, events bigint NOT NULL,
  last_version bigint NOT NULL, seq_sum bigint NOT NULL, disorder bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, stream_id));
SELECT kumiko_enable_tenancy('e2e_streams');
`

// StreamType is the aggregate type of the feature's streams.
const StreamType = "ticker"

// StreamsPartitions is the partition count of e2e:streams.
const StreamsPartitions = 4

// Options configure the feature in a process.
type Options struct {
	// InstanceID is the process's instance id, recorded by e2e:local.
	InstanceID string
	// ApplyDelay is slept per event in e2e:tally, so that a pass is long
	// enough for a test to kill the process in the middle of it. Defaults
	// to none.
	ApplyDelay time.Duration
}

// Feature is the registered feature.
type Feature struct {
	// Ticked is e2e:event:ticked.
	Ticked framework.EventType[Ticked]
}

// Register adds the e2e feature to r.
func Register(r *framework.Registry, opts Options) *Feature {
	f := r.Feature("e2e")
	ft := &Feature{Ticked: framework.DefineEvent[Ticked](f, "ticked", nil)}

	tally := framework.MultiStreamProjection(f, "tally", &framework.ProjectionOptions{Table: "e2e_tally"})
	framework.On(tally, ft.Ticked, func(ctx context.Context, tx *framework.Tx, e framework.Event[Ticked]) error {
		if _, err := tx.Exec(ctx, `INSERT INTO e2e_tally (tenant_id, position, instance_id) VALUES ($1, $2, $3)`,
			e.TenantID, e.ID, opts.InstanceID); err != nil {
			return err
		}
		if opts.ApplyDelay > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(opts.ApplyDelay):
			}
		}
		return nil
	})

	local := framework.MultiStreamProjection(f, "local", &framework.ProjectionOptions{Delivery: framework.DeliveryPerInstance})
	framework.On(local, ft.Ticked, func(ctx context.Context, tx *framework.Tx, e framework.Event[Ticked]) error {
		_, err := tx.Exec(ctx, `INSERT INTO e2e_local (tenant_id, instance_id, position) VALUES ($1, $2, $3)`,
			e.TenantID, opts.InstanceID, e.ID)
		return err
	})

	streams := framework.MultiStreamProjection(f, "streams", &framework.ProjectionOptions{Table: "e2e_streams", Partitions: StreamsPartitions})
	framework.On(streams, ft.Ticked, func(ctx context.Context, tx *framework.Tx, e framework.Event[Ticked]) error {
		_, err := tx.Exec(ctx, `INSERT INTO e2e_streams AS s (tenant_id, stream_id, events, last_version, seq_sum, disorder)
VALUES ($1, $2, 1, $3::bigint, $4::bigint, CASE WHEN $3::bigint = 1 THEN 0 ELSE 1 END)
ON CONFLICT (tenant_id, stream_id) DO UPDATE SET events = s.events + 1, last_version = EXCLUDED.last_version,
  seq_sum = s.seq_sum + EXCLUDED.seq_sum,
  disorder = s.disorder + CASE WHEN EXCLUDED.last_version = s.last_version + 1 THEN 0 ELSE 1 END`,
			e.TenantID, e.Stream.ID, e.Version, e.Payload.Seq)
		return err
	})
	return ft
}
