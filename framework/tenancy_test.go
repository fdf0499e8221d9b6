package framework_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
)

// tenantCounts is what an unfiltered count sees from inside a transaction.
type tenantCounts struct {
	Orders  int64 `json:"orders"`
	Events  int64 `json:"events"`
	Streams int64 `json:"streams"`
}

// tenantRow is one orders row as an unfiltered query returns it.
type tenantRow struct {
	TenantID string `json:"tenantId"`
	Customer string `json:"customer"`
}

// tamperInput selects the statement tenancy-test:write:tamper runs.
type tamperInput struct {
	Statement string `json:"statement" validate:"required"`
}

// The statements a tenant's handler tries against other tenants' rows or
// the append-only log. Each is chosen by name, never by the caller's SQL.
var tamperSQL = map[string]string{
	"insert-foreign-order": `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ('t2', gen_random_uuid(), 'intruder', 1)`,
	"insert-foreign-event": `INSERT INTO events (commit_key, tenant_id, stream_type, stream_id, version, type, payload)
		VALUES (pg_current_xact_id(), 't2', 'order', 'forged', 1, 'orders:event:placed', '{}')`,
	"move-order-to-t2": `UPDATE orders SET tenant_id = 't2'`,
	"update-events":    `UPDATE events SET payload = '{}'`,
	"delete-events":    `DELETE FROM events`,
}

// The statements a tenant's handler tries against the log's own columns,
// on its own tenant's rows: what only the append may compute (positions,
// commit keys, creation times, the streams head). Each would break the
// log for others or for later appends if it succeeded.
var forgeSQL = map[string]string{
	// A position one ahead of the sequence: the next append, whichever
	// tenant's, would draw it and fail on the duplicate.
	"position-ahead": `INSERT INTO events (position, commit_key, tenant_id, stream_type, stream_id, version, type, payload)
		VALUES (nextval('kumiko_event_position_seq') + 1, pg_current_xact_id(), 't1', 'order', 'forged', 1, 'orders:event:placed', '{}')`,
	// A commit key below the transaction's id: behind the consumers'
	// cursors, never delivered.
	"commit-key-behind": `INSERT INTO events (commit_key, tenant_id, stream_type, stream_id, version, type, payload)
		VALUES ('1', 't1', 'order', 'forged', 1, 'orders:event:placed', '{}')`,
	// A commit key ahead of the server's transaction ids: the restore
	// check pauses every tenant's writes.
	"commit-key-ahead": `INSERT INTO events (commit_key, tenant_id, stream_type, stream_id, version, type, payload)
		VALUES ((pg_current_xact_id()::text::bigint + 1000000000)::text::xid8, 't1', 'order', 'forged', 1, 'orders:event:placed', '{}')`,
	// A back-dated event: pruned and read as of times it did not exist.
	"created-at": `INSERT INTO events (commit_key, tenant_id, stream_type, stream_id, version, type, payload, created_at)
		VALUES (pg_current_xact_id(), 't1', 'order', 'forged', 1, 'orders:event:placed', '{}', '2000-01-01')`,
	// A new head ahead of the transaction ids: every event appended to it
	// inherits the key.
	"new-stream-ahead": `INSERT INTO streams (tenant_id, stream_type, stream_id, version, last_commit_key)
		VALUES ('t1', 'order', 'forged', 1, (pg_current_xact_id()::text::bigint + 1000000000)::text::xid8)`,
	"stream-key-ahead": `UPDATE streams SET version = version + 1,
		last_commit_key = (pg_current_xact_id()::text::bigint + 1000000000)::text::xid8`,
	// A rewound head: the stream's next append collides with its events.
	"stream-rewind": `UPDATE streams SET version = 0`,
	// A renamed head: the old stream restarts at version 1 over its events.
	"stream-rename": `UPDATE streams SET stream_id = stream_id || '-moved', version = version + 1,
		last_commit_key = GREATEST(pg_current_xact_id(), last_commit_key)`,
}

// countUnfiltered counts orders, events and streams with no tenant filter.
func countUnfiltered(ctx context.Context, tx *framework.Tx) (tenantCounts, error) {
	var c tenantCounts
	err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM events), (SELECT count(*) FROM streams)`).
		Scan(&c.Orders, &c.Events, &c.Streams)
	return c, err
}

// newTenancyBundle registers handlers that deliberately forget the tenant
// filter and seeds two orders of t1 and three of t2 through
// orders:write:place. The pool connects as the superuser postgres.
func newTenancyBundle(t *testing.T) *rtBundle {
	t.Helper()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		f := r.Feature("tenancy-test")
		framework.Write(f, "count", func(ctx context.Context, tx *framework.Tx, _ struct{}) (tenantCounts, error) {
			return countUnfiltered(ctx, tx)
		}, nil)
		framework.Write(f, "tamper", func(ctx context.Context, tx *framework.Tx, in tamperInput) (struct{}, error) {
			// A legitimate write of its own first: it must roll back with the rest.
			if _, err := tx.Exec(ctx, insertOrderSQL, tx.TenantID(), uuid.NewString(), "own", 1); err != nil {
				return struct{}{}, err
			}
			sql, ok := tamperSQL[in.Statement]
			if !ok {
				sql = forgeSQL[in.Statement]
			}
			_, err := tx.Exec(ctx, sql)
			return struct{}{}, err
		}, nil)
		framework.Write(f, "rename-all", func(ctx context.Context, tx *framework.Tx, _ struct{}) (int64, error) {
			tag, err := tx.Exec(ctx, `UPDATE orders SET customer = 'x'`)
			return tag.RowsAffected(), err
		}, nil)
		framework.Write(f, "delete-t2", func(ctx context.Context, tx *framework.Tx, _ struct{}) (int64, error) {
			tag, err := tx.Exec(ctx, `DELETE FROM orders WHERE tenant_id = 't2'`)
			return tag.RowsAffected(), err
		}, nil)
		framework.Query(f, "all-orders", func(ctx context.Context, tx *framework.Tx, _ struct{}) ([]tenantRow, error) {
			rows, err := tx.Query(ctx, `SELECT tenant_id, customer FROM orders ORDER BY customer`)
			if err != nil {
				return nil, err
			}
			return pgx.CollectRows(rows, pgx.RowToStructByPos[tenantRow])
		}, nil)
	})
	var super bool
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super))
	require.True(t, super, "the test pool connects as a superuser: RLS must hold anyway")

	b.place(t, "t1", "t1-a")
	b.place(t, "t1", "t1-b")
	b.place(t, "t2", "t2-a")
	b.place(t, "t2", "t2-b")
	b.place(t, "t2", "t2-c")
	return b
}

// requireSeedIntact checks that the seeded rows of both tenants are as
// placed.
func (b *rtBundle) requireSeedIntact(t *testing.T) {
	t.Helper()
	require.Equal(t, int64(2), b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = 't1' AND customer LIKE 't1-%'`))
	require.Equal(t, int64(3), b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = 't2' AND customer LIKE 't2-%'`))
	require.Equal(t, int64(5), b.count(t, `SELECT count(*) FROM orders`))
	require.Equal(t, int64(2), b.count(t, `SELECT count(*) FROM events WHERE tenant_id = 't1'`))
	require.Equal(t, int64(3), b.count(t, `SELECT count(*) FROM events WHERE tenant_id = 't2'`))
	require.Equal(t, int64(5), b.count(t, `SELECT count(*) FROM events`))
	require.Equal(t, int64(3), b.count(t, `SELECT count(*) FROM events WHERE payload->>'customer' LIKE 't2-%' AND payload <> '{}'`))
}

// A handler that forgets the tenant filter still sees only its tenant's
// rows, in business tables and in the event log.
func TestTenancyUnfilteredReadsSeeOwnTenant(t *testing.T) {
	t.Parallel()
	b := newTenancyBundle(t)
	for tenant, want := range map[string]tenantCounts{
		"t1": {Orders: 2, Events: 2, Streams: 2},
		"t2": {Orders: 3, Events: 3, Streams: 3},
		"t3": {},
	} {
		out, err := b.write(t, callAs(tenant, "u-"+tenant), "tenancy-test:write:count", struct{}{})
		require.NoError(t, err)
		require.Equal(t, want, out, tenant)
	}
	// The superuser pool itself is not confined.
	require.Equal(t, int64(5), b.count(t, `SELECT count(*) FROM orders`))
}

// A query handler reading orders without a filter never sees another
// tenant's rows.
func TestTenancyQuerySeesOwnTenant(t *testing.T) {
	t.Parallel()
	b := newTenancyBundle(t)
	out, err := b.rt.Query(t.Context(), callAs("t1", "alice"), framework.Command{Type: "tenancy-test:query:all-orders"})
	require.NoError(t, err)
	require.Equal(t, []tenantRow{{"t1", "t1-a"}, {"t1", "t1-b"}}, out)

	// The sample feature's list query, too.
	out, err = b.rt.Query(t.Context(), callAs("t2", "bob"), framework.Command{Type: "orders:query:list", Payload: []byte(`{}`)})
	require.NoError(t, err)
	list, ok := out.(orders.ListResult)
	require.True(t, ok)
	require.Len(t, list.Items, 3)
	for _, o := range list.Items {
		require.Contains(t, o.Customer, "t2-")
	}

	// And get by id of another tenant's order is not found.
	var t2ID string
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT id::text FROM orders WHERE tenant_id = 't2' LIMIT 1`).Scan(&t2ID))
	_, err = b.rt.Query(t.Context(), callAs("t1", "alice"), command(t, "orders:query:get", orders.GetInput{OrderID: t2ID}))
	require.ErrorIs(t, err, framework.ErrNotFound)
}

// Writing a row of another tenant, moving a row to another tenant,
// forging another tenant's event or changing the append-only log fails
// with access_denied (403), and nothing of the transaction persists.
func TestTenancyForeignWritesAreDenied(t *testing.T) {
	t.Parallel()
	b := newTenancyBundle(t)
	for _, stmt := range []string{"insert-foreign-order", "insert-foreign-event", "move-order-to-t2", "update-events", "delete-events"} {
		_, err := b.write(t, callAs("t1", "alice"), "tenancy-test:write:tamper", tamperInput{Statement: stmt})
		require.Error(t, err, stmt)
		e := framework.ToError(err)
		require.Equal(t, framework.CodeAccessDenied, e.Code, "%s: %v", stmt, err)
		require.Equal(t, http.StatusForbidden, e.Code.HTTPStatus(), stmt)
		require.ErrorIs(t, e, framework.ErrAccessDenied, stmt)
		require.Zero(t, b.count(t, `SELECT count(*) FROM orders WHERE customer IN ('own', 'intruder')`), stmt)
		b.requireSeedIntact(t)
	}
}

// A handler's raw SQL cannot write what only the append computes: a
// position of its choosing, a commit key outside [own id, next id), a
// creation time, or a streams head that moves other than forward by an
// append. Each attempt fails, nothing of its transaction persists, and the
// log stays usable for both tenants: appends of the other tenant and to the
// tampering tenant's streams succeed, and the restore check stays quiet.
func TestTenancyForgedLogColumnsAreDenied(t *testing.T) {
	t.Parallel()
	b := newTenancyBundle(t)
	var stream framework.Stream
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT stream_type, stream_id FROM streams WHERE tenant_id = 't1' ORDER BY stream_id LIMIT 1`).
		Scan(&stream.Type, &stream.ID))
	// Why each is refused: a column the role may not name, a policy, the
	// head row's trigger.
	reasons := map[string]string{
		"position-ahead":    "permission denied for table events",
		"created-at":        "permission denied for table events",
		"commit-key-behind": `policy "kumiko_commit_key" for table "events"`,
		"commit-key-ahead":  "is in the future",
		"new-stream-ahead":  `policy "kumiko_commit_key" for table "streams"`,
		"stream-key-ahead":  "its head row moves only by an append",
		"stream-rewind":     "its head row moves only by an append",
		"stream-rename":     "its head row moves only by an append",
	}
	require.Len(t, reasons, len(forgeSQL))
	var placed int
	for stmt := range forgeSQL {
		_, err := b.write(t, callAs("t1", "alice"), "tenancy-test:write:tamper", tamperInput{Statement: stmt})
		require.ErrorContains(t, err, reasons[stmt], stmt)
		require.Zero(t, b.count(t, `SELECT count(*) FROM orders WHERE customer = 'own'`), stmt)
		require.Zero(t, b.count(t, `SELECT count(*) FROM events WHERE stream_id LIKE 'forged%' OR created_at < '2001-01-01'`), stmt)
		require.Zero(t, b.count(t, `SELECT count(*) FROM streams WHERE stream_id LIKE 'forged%' OR stream_id LIKE '%-moved'`), stmt)
		require.NoError(t, eventstore.CheckCommitKeys(t.Context(), b.db.Pool), stmt)

		// The other tenant appends to a new stream (the next position)...
		b.place(t, "t2", "t2-after-"+stmt)
		// ... and the tampering tenant's stream takes its next version.
		_, err = b.rt.InTx(t.Context(), "t1", framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
			return tx.Append(stream, framework.AnyVersion, b.orders.Placed.With(orders.Placed{OrderID: uuid.NewString(), Customer: "again", AmountCents: 1}))
		})
		require.NoError(t, err, stmt)
		placed++
		require.Equal(t, int64(1+placed), b.count(t, `SELECT version FROM streams WHERE tenant_id = 't1' AND stream_type = $1 AND stream_id = $2`, stream.Type, stream.ID), stmt)
		require.Equal(t, int64(1+placed), b.count(t, `SELECT count(*) FROM events WHERE tenant_id = 't1' AND stream_type = $1 AND stream_id = $2`, stream.Type, stream.ID), stmt)
	}
}

// What the database does not refuse (README, Tenancy): a raw insert that
// skips the streams head is stored, delivered at its own commit key like an
// appended event, and the stream's next append collides with it.
func TestTenancyRawEventSkippingTheHeadBlocksTheStream(t *testing.T) {
	t.Parallel()
	b := newTenancyBundle(t)
	var stream framework.Stream
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT stream_type, stream_id FROM streams WHERE tenant_id = 't1' ORDER BY stream_id LIMIT 1`).
		Scan(&stream.Type, &stream.ID))
	_, err := b.rt.InTx(t.Context(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO events (commit_key, tenant_id, stream_type, stream_id, version, type, payload)
			VALUES (pg_current_xact_id(), 't1', $1, $2, 2, 'orders:event:placed', '{}')`, stream.Type, stream.ID)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), b.count(t, `SELECT version FROM streams WHERE tenant_id = 't1' AND stream_type = $1 AND stream_id = $2`, stream.Type, stream.ID))

	_, err = b.rt.InTx(t.Context(), "t1", framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
		return tx.Append(stream, framework.AnyVersion, b.orders.Placed.With(orders.Placed{OrderID: uuid.NewString(), Customer: "again", AmountCents: 1}))
	})
	require.Error(t, err)
	require.Equal(t, framework.CodeVersionConflict, framework.ToError(err).Code, "%v", err)
}

// An unfiltered UPDATE changes only the caller's rows; an explicit DELETE
// of another tenant's rows deletes nothing.
func TestTenancyUnfilteredUpdateChangesOwnRows(t *testing.T) {
	t.Parallel()
	b := newTenancyBundle(t)
	out, err := b.write(t, callAs("t1", "alice"), "tenancy-test:write:rename-all", struct{}{})
	require.NoError(t, err)
	require.Equal(t, int64(2), out)
	require.Equal(t, int64(2), b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = 't1' AND customer = 'x'`))
	require.Equal(t, int64(3), b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = 't2' AND customer LIKE 't2-%'`))
	require.Zero(t, b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = 't2' AND customer = 'x'`))

	out, err = b.write(t, callAs("t1", "alice"), "tenancy-test:write:delete-t2", struct{}{})
	require.NoError(t, err)
	require.Equal(t, int64(0), out)
	require.Equal(t, int64(3), b.count(t, `SELECT count(*) FROM orders WHERE tenant_id = 't2'`))
}

// The system tenant's transactions run unrestricted: they see both
// tenants.
func TestTenancySystemTenantSeesAll(t *testing.T) {
	t.Parallel()
	b := newTenancyBundle(t)
	var c tenantCounts
	_, err := b.rt.InTx(t.Context(), framework.SystemTenantID, framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		require.Equal(t, framework.SystemTenantID, tx.TenantID())
		var err error
		c, err = countUnfiltered(ctx, tx)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, tenantCounts{Orders: 5, Events: 5, Streams: 5}, c)

	// A tenant's InTx, by contrast, is confined like its handlers.
	_, err = b.rt.InTx(t.Context(), "t2", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		var err error
		c, err = countUnfiltered(ctx, tx)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, tenantCounts{Orders: 3, Events: 3, Streams: 3}, c)
}
