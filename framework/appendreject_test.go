package framework_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// appendRejected is the payload of the rejected-append tests' event.
type appendRejected struct {
	Email string `json:"email" validate:"required,email"`
}

// TestRejectedAppendFailsTheWriteEvenWhenIgnored: an append refused at the
// call site (a payload failing its validator tags, an event type this
// registry never declared) fails the whole transaction, also when the
// handler drops Append's error: the business row must not commit without
// its event (ARCHITECTURE §3: rejected and nothing is written; Kumiko's
// appendEvent throws, which no handler ignores by accident).
func TestRejectedAppendFailsTheWriteEvenWhenIgnored(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := kumikotest.NewDB(t)
	_, err := db.Pool.Exec(ctx, `CREATE TABLE rejected_rows (tenant_id text NOT NULL, id text NOT NULL);
		SELECT kumiko_enable_tenancy('rejected_rows')`)
	require.NoError(t, err)

	other := framework.NewRegistry()
	foreign := framework.DefineEvent[appendRejected](other.Feature("other"), "invited", nil)

	reg := framework.NewRegistry()
	f := reg.Feature("rejects")
	invited := framework.DefineEvent[appendRejected](f, "invited", nil)
	type in struct {
		ID string `json:"id" validate:"required"`
	}
	write := func(ev func() framework.PendingEvent) framework.WriteHandler[in, string] {
		return func(ctx context.Context, tx *framework.Tx, in in) (string, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO rejected_rows VALUES ($1, $2)`, tx.TenantID(), in.ID); err != nil {
				return "", err
			}
			_ = tx.Append(framework.Stream{Type: "user", ID: in.ID}, framework.NoStream, ev()) // the bug under test
			return in.ID, nil
		}
	}
	framework.Write(f, "invalid", write(func() framework.PendingEvent { return invited.With(appendRejected{Email: "not-a-mail"}) }), nil)
	framework.Write(f, "undeclared", write(func() framework.PendingEvent { return foreign.With(appendRejected{Email: "a@b.example"}) }), nil)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)

	call := framework.Call{Principal: framework.Principal{UserID: "u1", TenantID: "t1"}}
	_, err = rt.Write(ctx, call, []framework.Command{{Type: "rejects:write:invalid", Payload: json.RawMessage(`{"id":"a"}`)}})
	var verr *framework.ValidationError
	require.True(t, errors.As(err, &verr), "got %v", err)
	require.Equal(t, framework.CodeValidation, framework.ToError(err).Code)

	_, err = rt.Write(ctx, call, []framework.Command{{Type: "rejects:write:undeclared", Payload: json.RawMessage(`{"id":"b"}`)}})
	require.ErrorContains(t, err, "undeclared event type")

	var rows, events int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM rejected_rows`).Scan(&rows))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&events))
	require.Zero(t, rows, "the business rows committed without their events")
	require.Zero(t, events)
}
