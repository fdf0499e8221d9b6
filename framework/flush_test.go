package framework_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/tenancy"
)

// flushNoted is the payload of the flush tests' events.
type flushNoted struct {
	N int `json:"n"`
}

// TestFlushRunsInlineProjectionsOnceEach: a Tx that the framework's write
// path did not open (NewEventTx, as the dispatcher and other callers use
// it) runs inline projections when it flushes, in its transaction: the
// placed event's projection, which appends a shipped event and reads its
// stream back (a flush inside the flush), and the shipped event's. Each
// runs once, however many flushes follow.
func TestFlushRunsInlineProjectionsOnceEach(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := kumikotest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE projected (tenant_id text NOT NULL, projection text, position bigint);
		SELECT kumiko_enable_tenancy('projected')`)
	require.NoError(t, err)

	reg := framework.NewRegistry()
	f := reg.Feature("flush")
	placed := framework.DefineEvent[flushNoted](f, "placed", nil)
	shipped := framework.DefineEvent[flushNoted](f, "shipped", nil)
	stream := framework.Stream{Type: "order", ID: "1"}
	record := func(ctx context.Context, tx *framework.Tx, projection string, position int64) error {
		_, err := tx.Exec(ctx, `INSERT INTO projected VALUES ($1, $2, $3)`, tx.TenantID(), projection, position)
		return err
	}
	placedLog := framework.InlineProjection(f, "placed-log")
	framework.On(placedLog, placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[flushNoted]) error {
		if err := record(ctx, tx, "placed-log", e.ID); err != nil {
			return err
		}
		if err := tx.Append(stream, framework.AnyVersion, shipped.With(flushNoted{N: e.Payload.N})); err != nil {
			return err
		}
		_, err := tx.ReadStream(ctx, stream, framework.AsOf{})
		return err
	})
	shippedLog := framework.InlineProjection(f, "shipped-log")
	framework.On(shippedLog, shipped, func(ctx context.Context, tx *framework.Tx, e framework.Event[flushNoted]) error {
		return record(ctx, tx, "shipped-log", e.ID)
	})
	require.NoError(t, reg.Build())

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	require.NoError(t, tenancy.Begin(ctx, conn.Conn(), "t1", tenancy.Options{}))
	defer func() { _, _ = conn.Exec(context.Background(), "ROLLBACK") }()

	tx := framework.NewEventTx(conn.Conn(), reg, framework.Envelope{TenantID: "t1", Position: 1})
	require.NoError(t, tx.Append(stream, framework.NoStream, placed.With(flushNoted{N: 1})))
	written, err := tx.Flush(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, written)
	require.Equal(t, "flush:event:placed", written[0].Type)
	_, err = tx.Flush(ctx)
	require.NoError(t, err)

	rows, err := conn.Query(ctx, `SELECT e.type || ' ' || p.projection FROM projected p JOIN events e USING (position)
		ORDER BY p.position`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"flush:event:placed placed-log", "flush:event:shipped shipped-log"}, got,
		"each event's inline projection ran once")
	require.Equal(t, 2, tx.Written())
}

// TestInlineProjectionFailureInIgnoredReadFailsTheWrite: a write handler
// appends, reads its stream back (which writes the event and runs its
// inline projection, which fails) and ignores the read's error. The write
// still fails with the projection's error, and nothing commits: the event
// is not stored without its read model.
func TestInlineProjectionFailureInIgnoredReadFailsTheWrite(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("flush")
	placed := framework.DefineEvent[flushNoted](f, "placed", nil)
	stream := framework.Stream{Type: "order", ID: "1"}
	refusing := framework.InlineProjection(f, "refusing")
	framework.On(refusing, placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[flushNoted]) error {
		return errors.New("read model refused")
	})
	framework.Write(f, "place", func(ctx context.Context, tx *framework.Tx, _ struct{}) (string, error) {
		if err := tx.Append(stream, framework.NoStream, placed.With(flushNoted{N: 1})); err != nil {
			return "", err
		}
		_, _ = tx.ReadStream(ctx, stream, framework.AsOf{}) // fails; the handler ignores it
		return "ok", nil
	}, nil)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)

	call := framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "t1"}}
	_, err = rt.Write(t.Context(), call, []framework.Command{{Type: "flush:write:place"}})
	require.ErrorContains(t, err, "read model refused")
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM events`).Scan(&n))
	require.Zero(t, n, "the event committed although its inline projection failed")
}
