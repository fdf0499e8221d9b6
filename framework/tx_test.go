package framework_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// rtBundle is a runtime on a fresh migrated database with the orders
// feature registered, plus whatever the test registers beside it.
type rtBundle struct {
	db     *kumikotest.DB
	rt     *framework.Runtime
	orders *orders.Feature
}

// newRTBundle creates the database, runs the schema statements (as the
// superuser owner), registers orders and then register's additions, and
// builds the runtime.
func newRTBundle(t *testing.T, register func(r *framework.Registry, o *orders.Feature), schema ...string) *rtBundle {
	t.Helper()
	db := kumikotest.NewDB(t)
	for _, s := range schema {
		_, err := db.Pool.Exec(t.Context(), s)
		require.NoError(t, err)
	}
	reg := framework.NewRegistry()
	o := orders.Register(reg)
	if register != nil {
		register(reg, o)
	}
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	return &rtBundle{db: db, rt: rt, orders: o}
}

// callAs is a request of user in tenant with a fixed request id.
func callAs(tenant, user string) framework.Call {
	return framework.Call{Principal: framework.Principal{UserID: user, TenantID: tenant}, RequestID: "req-" + user}
}

// command encodes payload as the command's JSON.
func command(t *testing.T, typ string, payload any) framework.Command {
	t.Helper()
	b, err := json.Marshal(payload)
	require.NoError(t, err)
	return framework.Command{Type: typ, Payload: b}
}

// write runs one command and returns its result.
func (b *rtBundle) write(t *testing.T, call framework.Call, typ string, payload any) (any, error) {
	t.Helper()
	res, err := b.rt.Write(t.Context(), call, []framework.Command{command(t, typ, payload)})
	if err != nil {
		return nil, err
	}
	require.Len(t, res, 1)
	return res[0], nil
}

// place places an order for tenant and returns its id.
func (b *rtBundle) place(t *testing.T, tenant, customer string) string {
	t.Helper()
	out, err := b.write(t, callAs(tenant, "u-"+tenant), "orders:write:place", orders.PlaceInput{Customer: customer, AmountCents: 100})
	require.NoError(t, err)
	res, ok := out.(orders.WriteResult)
	require.True(t, ok, "result is %T", out)
	return res.ID
}

// count runs a count query as the superuser (no row-level security).
func (b *rtBundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), sql, args...).Scan(&n))
	return n
}

// requireNothingPersisted checks that no business row, event or stream
// exists.
func (b *rtBundle) requireNothingPersisted(t *testing.T) {
	t.Helper()
	require.Zero(t, b.count(t, `SELECT count(*) FROM orders`), "orders")
	require.Zero(t, b.count(t, `SELECT count(*) FROM events`), "events")
	require.Zero(t, b.count(t, `SELECT count(*) FROM streams`), "streams")
}

const insertOrderSQL = `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ($1, $2, $3, $4)`

func orderStream(id string) framework.Stream {
	return framework.Stream{Type: orders.StreamType, ID: id}
}

// noted is the payload of the tests' tx-test:event:noted.
type noted struct {
	Text string `json:"text" validate:"required"`
}

// noteInput is the payload of tx-test:write:note: append a note to an
// order's stream at the expected version and change the order's customer.
type noteInput struct {
	OrderID         string `json:"orderId" validate:"required,uuid"`
	ExpectedVersion int64  `json:"expectedVersion"`
	Customer        string `json:"customer" validate:"required"`
}

// registerNote registers tx-test:event:noted and tx-test:write:note, which
// reads the stream with FetchForWriting before it appends; fetched records
// the version FetchForWriting returned.
func registerNote(r *framework.Registry, fetched *int64) framework.EventType[noted] {
	f := r.Feature("tx-test")
	ev := framework.DefineEvent[noted](f, "noted", nil)
	framework.Write(f, "note", func(ctx context.Context, tx *framework.Tx, in noteInput) (int64, error) {
		_, v, err := tx.FetchForWriting(ctx, orderStream(in.OrderID))
		if err != nil {
			return 0, err
		}
		if fetched != nil {
			*fetched = v
		}
		if _, err := tx.Exec(ctx, `UPDATE orders SET customer = $2 WHERE id = $1`, in.OrderID, in.Customer); err != nil {
			return 0, err
		}
		return v + 1, tx.Append(orderStream(in.OrderID), in.ExpectedVersion, ev.With(noted{Text: in.Customer}))
	}, nil)
	return ev
}

// Appending an event type this registry never declared fails at the
// Append call (not at commit), buffers nothing, and writes nothing.
func TestAppendUndeclaredEventType(t *testing.T) {
	t.Parallel()
	other := framework.NewRegistry()
	// Same qualified name as the real one, but another registry's handle.
	foreign := framework.DefineEvent[orders.Placed](other.Feature("orders"), "placed", nil)
	handles := map[string]framework.EventType[orders.Placed]{
		"foreign": foreign,
		"zero":    {},
	}
	type in struct {
		Which string `json:"which" validate:"oneof=foreign zero"`
	}
	var callErr error
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		framework.Write(r.Feature("tx-test"), "append-undeclared", func(ctx context.Context, tx *framework.Tx, in in) (struct{}, error) {
			id := uuid.NewString()
			if _, err := tx.Exec(ctx, insertOrderSQL, tx.TenantID(), id, "ada", 1); err != nil {
				return struct{}{}, err
			}
			callErr = tx.Append(orderStream(id), framework.NoStream, handles[in.Which].With(orders.Placed{OrderID: id, Customer: "ada"}))
			return struct{}{}, callErr
		}, nil)
	})

	for which, want := range map[string]string{
		"foreign": `kumiko: append of undeclared event type "orders:event:placed"`,
		"zero":    `kumiko: append of undeclared event type ""`,
	} {
		callErr = nil
		_, err := b.write(t, callAs("t1", "alice"), "tx-test:write:append-undeclared", in{Which: which})
		require.Error(t, callErr, which)
		require.ErrorContains(t, callErr, want, which)
		require.ErrorIs(t, err, callErr, which)
		b.requireNothingPersisted(t)

		// Directly in a transaction whose function goes on past the failed
		// Append: the refusal fails the transaction, so the valid append
		// after it is not written either (ARCHITECTURE §3: nothing is
		// written).
		id := uuid.NewString()
		_, err = b.rt.InTx(t.Context(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			err := tx.Append(orderStream(id), framework.NoStream, handles[which].With(orders.Placed{OrderID: id, Customer: "ada"}))
			require.ErrorContains(t, err, want, which)
			return tx.Append(orderStream(id), framework.AnyVersion, b.orders.Placed.With(orders.Placed{OrderID: id, Customer: "bob"}))
		})
		require.ErrorContains(t, err, want, which)
		require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM events`))
	}
}

// An event payload that fails its validator tags is rejected at the Append
// call with a *ValidationError listing every field; the handler returns it
// and nothing of the transaction persists, not even the business row
// inserted before the Append.
func TestAppendInvalidPayloadRollsBack(t *testing.T) {
	t.Parallel()
	var callErr error
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		framework.Write(r.Feature("tx-test"), "place-invalid", func(ctx context.Context, tx *framework.Tx, _ struct{}) (struct{}, error) {
			id := uuid.NewString()
			if _, err := tx.Exec(ctx, insertOrderSQL, tx.TenantID(), id, "ada", 1); err != nil {
				return struct{}{}, err
			}
			callErr = tx.Append(orderStream(id), framework.NoStream, o.Placed.With(orders.Placed{OrderID: "not-a-uuid", AmountCents: -1}))
			return struct{}{}, callErr
		}, nil)
	})

	_, err := b.write(t, callAs("t1", "alice"), "tx-test:write:place-invalid", struct{}{})
	var ve *framework.ValidationError
	require.ErrorAs(t, callErr, &ve, "Append itself reports the invalid payload")
	require.ErrorAs(t, err, &ve)
	require.Equal(t, []framework.FieldError{
		{Field: "orderId", Rule: "uuid", Message: "orderId must be a UUID"},
		{Field: "customer", Rule: "required", Message: "customer is required"},
		{Field: "amountCents", Rule: "gte", Param: "0", Message: "amountCents must be >= 0"},
	}, ve.Fields)

	e := framework.ToError(err)
	require.Equal(t, framework.CodeValidation, e.Code)
	require.Equal(t, http.StatusBadRequest, e.Code.HTTPStatus())
	require.Equal(t, map[string]any{"fields": ve.Fields}, e.Details)
	b.requireNothingPersisted(t)

	// The command payload is validated before the handler runs, too.
	_, err = b.write(t, callAs("t1", "alice"), "orders:write:place", map[string]any{"customer": "", "amountCents": 5})
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "customer", ve.Fields[0].Field)
	b.requireNothingPersisted(t)
}

// A NUL (U+0000) that reaches the database, in a text column (SQLSTATE
// 22021) or in an event's jsonb payload (22P05), is the caller's bad input:
// a validation_error, not an internal error, and nothing persists.
func TestNULInAValueIsAValidationError(t *testing.T) {
	t.Parallel()
	var ev framework.EventType[noted]
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		ev = framework.DefineEvent[noted](r.Feature("tx-test"), "noted", nil)
		framework.Write(r.Feature("tx-test"), "note-only", func(ctx context.Context, tx *framework.Tx, in noted) (struct{}, error) {
			return struct{}{}, tx.Append(orderStream(uuid.NewString()), framework.NoStream, ev.With(in))
		}, nil)
	})
	for typ, payload := range map[string]map[string]any{
		"orders:write:place":      {"customer": "A\x00B", "amountCents": 1}, // the orders row's text column
		"tx-test:write:note-only": {"text": "A\x00B"},                       // only the event's jsonb
	} {
		_, err := b.write(t, callAs("t1", "alice"), typ, payload)
		e := framework.ToError(err)
		require.Equal(t, framework.CodeValidation, e.Code, "%s: %v", typ, err)
		require.Contains(t, e.Message, "NUL")
		b.requireNothingPersisted(t)
	}
	// The same SQLSTATE 22021 is what a byte sequence that is not UTF-8
	// gets (a Go caller's string, an admin route's %FF): the message must
	// not send its caller looking for a NUL that is not there.
	_, err := b.rt.InTx(t.Context(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (tenant_id, id, customer, amount_cents) VALUES ($1, $2, $3, 1)`,
			tx.TenantID(), uuid.NewString(), "A\xffB")
		return err
	})
	e := framework.ToError(err)
	require.Equal(t, framework.CodeValidation, e.Code, "%v", err)
	require.Contains(t, e.Message, "not valid UTF-8")
	b.requireNothingPersisted(t)
}

// measured is the payload of tx-test:event:measured: a number kept as the
// client wrote it.
type measured struct {
	Value json.Number `json:"value" validate:"required"`
}

// A number valid in JSON but beyond what Postgres' jsonb stores (an
// exponent of a million; SQLSTATE 22003), in a payload type that keeps it
// as written (json.Number, json.RawMessage), is the client's bad input: a
// validation_error, not an internal error, and nothing persists.
func TestNumberOutOfRangeInAPayloadIsAValidationError(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		f := r.Feature("tx-test")
		ev := framework.DefineEvent[measured](f, "measured", nil)
		framework.Write(f, "measure", func(ctx context.Context, tx *framework.Tx, in measured) (struct{}, error) {
			return struct{}{}, tx.Append(orderStream(uuid.NewString()), framework.NoStream, ev.With(in))
		}, nil)
	})
	for _, n := range []string{"1e999999", "-1e999999", "1e-999999"} {
		_, err := b.rt.Write(t.Context(), callAs("t1", "alice"),
			[]framework.Command{{Type: "tx-test:write:measure", Payload: json.RawMessage(`{"value":` + n + `}`)}})
		e := framework.ToError(err)
		require.Equal(t, framework.CodeValidation, e.Code, "%s: %v", n, err)
		require.Contains(t, e.Message, "out of range", n)
		b.requireNothingPersisted(t)
	}
}

// personV2 is version 2 of tx-test:event:person-named; version 1 stored
// {"name": ...}.
type personV2 struct {
	FullName string `json:"fullName" validate:"required"`
}

// Upcasters lift stored rows of an older schema version on every read:
// Aggregate.Load, EventType.Decode and Registry.UpcastPayload all see the
// current shape, while the stored row stays as written.
func TestUpcastersApplyOnRead(t *testing.T) {
	t.Parallel()
	var named framework.EventType[personV2]
	upcasts := 0
	var mu sync.Mutex
	agg := framework.NewAggregate[[]string]("person")
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		named = framework.DefineEvent[personV2](r.Feature("tx-test"), "person-named", &framework.EventOptions{
			Version: 2,
			Upcasters: map[int]framework.Upcaster{1: func(p json.RawMessage) (json.RawMessage, error) {
				mu.Lock()
				upcasts++
				mu.Unlock()
				var v1 struct {
					Name string `json:"name"`
				}
				if err := json.Unmarshal(p, &v1); err != nil {
					return nil, err
				}
				if v1.Name == "" {
					return nil, errors.New("version 1 without a name")
				}
				return json.Marshal(personV2{FullName: v1.Name})
			}},
		})
		framework.Evolve(agg, named, func(s *[]string, e framework.Event[personV2]) { *s = append(*s, e.Payload.FullName) })
	})
	require.Equal(t, 2, named.Version())

	// A version-1 row as an older release wrote it.
	id := uuid.NewString()
	ctx := t.Context()
	pgTx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = eventstore.Append(ctx, pgTx, eventstore.StreamRef{TenantID: "t1", Type: "person", ID: id}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: named.Name(), TypeVersion: 1, Payload: json.RawMessage(`{"name":"Ada Lovelace"}`)}})
	require.NoError(t, err)
	require.NoError(t, pgTx.Commit(ctx))

	// And a version-2 event appended by the current code.
	_, err = b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		return tx.Append(agg.Stream(id), 1, named.With(personV2{FullName: "Grace Hopper"}))
	})
	require.NoError(t, err)

	_, err = b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		names, version, err := agg.Load(ctx, tx, id, framework.AsOf{})
		require.NoError(t, err)
		require.Equal(t, []string{"Ada Lovelace", "Grace Hopper"}, names)
		require.EqualValues(t, 2, version)

		envs, err := tx.ReadStream(ctx, agg.Stream(id), framework.AsOf{})
		require.NoError(t, err)
		require.Len(t, envs, 2)
		require.Equal(t, 1, envs[0].TypeVersion)
		require.JSONEq(t, `{"name":"Ada Lovelace"}`, string(envs[0].Payload), "the stored row is not rewritten")
		require.Equal(t, 2, envs[1].TypeVersion)

		e, ok, err := named.Decode(envs[0])
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, "Ada Lovelace", e.Payload.FullName)
		require.EqualValues(t, 1, e.Version)
		require.Equal(t, framework.Stream{Type: "person", ID: id}, e.Stream)
		require.Equal(t, "t1", e.TenantID)

		up, err := b.rt.Registry().UpcastPayload(envs[0])
		require.NoError(t, err)
		require.JSONEq(t, `{"fullName":"Ada Lovelace"}`, string(up))
		up, err = b.rt.Registry().UpcastPayload(envs[1])
		require.NoError(t, err)
		require.JSONEq(t, `{"fullName":"Grace Hopper"}`, string(up), "current versions pass through")

		_, ok, err = b.orders.Placed.Decode(envs[0])
		require.NoError(t, err)
		require.False(t, ok, "another type's handle does not decode it")
		return nil
	})
	require.NoError(t, err)
	mu.Lock()
	require.Equal(t, 3, upcasts, "Load, Decode and UpcastPayload each upcast the v1 row once; v2 rows never")
	mu.Unlock()

	// A failing upcaster fails the read with the event's type in the error.
	bad := uuid.NewString()
	pgTx, err = b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = eventstore.Append(ctx, pgTx, eventstore.StreamRef{TenantID: "t1", Type: "person", ID: bad}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: named.Name(), TypeVersion: 1, Payload: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	require.NoError(t, pgTx.Commit(ctx))
	_, err = b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		_, _, err := agg.Load(ctx, tx, bad, framework.AsOf{})
		return err
	})
	require.Regexp(t, `tx-test:event:person-named at \d+: upcast from version 1: version 1 without a name`, err,
		"the error names the stored event's position")

}

// TestUpcasterPanicIsAnError: a panicking upcaster fails the read with an
// error naming the event and its position, like an erring one; the panic
// does not escape to the reader (the SSE fan-out has no one to recover it).
func TestUpcasterPanicIsAnError(t *testing.T) {
	t.Parallel()
	var named framework.EventType[personV2]
	agg := framework.NewAggregate[[]string]("person")
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		named = framework.DefineEvent[personV2](r.Feature("tx-test"), "person-named", &framework.EventOptions{
			Version: 2,
			Upcasters: map[int]framework.Upcaster{1: func(json.RawMessage) (json.RawMessage, error) {
				var m map[string]any
				return json.Marshal(personV2{FullName: m["name"].(string)})
			}},
		})
		framework.Evolve(agg, named, func(s *[]string, e framework.Event[personV2]) { *s = append(*s, e.Payload.FullName) })
	})
	id := uuid.NewString()
	ctx := t.Context()
	_, err := eventstore.Append(ctx, b.db.Pool, eventstore.StreamRef{TenantID: "t1", Type: "person", ID: id}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: named.Name(), TypeVersion: 1, Payload: json.RawMessage(`{}`)}})
	require.NoError(t, err)
	_, err = b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		_, _, err := agg.Load(ctx, tx, id, framework.AsOf{})
		return err
	})
	// Where the upcaster panicked: the recovery that turns the panic into
	// an error drops the stack the dispatcher's and the HTTP server's own
	// recovery logged, so the error itself names the panicking line.
	require.Regexp(t, `tx-test:event:person-named at \d+: upcast from version 1: upcaster panicked at \S+ \(tx_test\.go:\d+\): interface conversion`, err)
}

// counted is the payload of tx-test:event:counted.
type counted struct {
	N int64 `json:"n" validate:"gte=1"`
}

// counter is the state folded from counted events.
type counter struct {
	Sum, Count int64
}

// LoadAggregate reads a stream as of a version or a time.
func TestLoadAggregateAsOf(t *testing.T) {
	t.Parallel()
	agg := framework.NewAggregate[counter]("counter")
	var ev framework.EventType[counted]
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		ev = framework.DefineEvent[counted](r.Feature("tx-test"), "counted", nil)
		framework.Evolve(agg, ev, func(s *counter, e framework.Event[counted]) { s.Sum += e.Payload.N; s.Count++ })
	})
	ctx := t.Context()
	id := uuid.NewString()
	// Three events in three transactions, so each has its own created_at.
	for i, n := range []int64{1, 10, 100} {
		_, err := b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
			return tx.Append(agg.Stream(id), int64(i), ev.With(counted{N: n}))
		})
		require.NoError(t, err)
	}

	_, err := b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		envs, err := tx.ReadStream(ctx, agg.Stream(id), framework.AsOf{})
		require.NoError(t, err)
		require.Len(t, envs, 3)
		require.True(t, envs[0].CreatedAt.Before(envs[1].CreatedAt))
		require.True(t, envs[1].CreatedAt.Before(envs[2].CreatedAt))

		for _, tc := range []struct {
			name    string
			asOf    framework.AsOf
			state   counter
			version int64
		}{
			{"now", framework.AsOf{}, counter{111, 3}, 3},
			{"version 1", framework.AsOf{Version: 1}, counter{1, 1}, 1},
			{"version 2", framework.AsOf{Version: 2}, counter{11, 2}, 2},
			{"version past the head", framework.AsOf{Version: 99}, counter{111, 3}, 3},
			{"time of event 2", framework.AsOf{Time: envs[1].CreatedAt}, counter{11, 2}, 2},
			{"just before event 2", framework.AsOf{Time: envs[1].CreatedAt.Add(-time.Microsecond)}, counter{1, 1}, 1},
			{"before the stream", framework.AsOf{Time: envs[0].CreatedAt.Add(-time.Microsecond)}, counter{}, 0},
			{"time in the future", framework.AsOf{Time: time.Now().Add(time.Hour)}, counter{111, 3}, 3},
			{"version and time: the earlier bound wins", framework.AsOf{Version: 1, Time: envs[2].CreatedAt}, counter{1, 1}, 1},
		} {
			s, v, err := agg.Load(ctx, tx, id, tc.asOf)
			require.NoError(t, err, tc.name)
			require.Equal(t, tc.state, s, tc.name)
			require.Equal(t, tc.version, v, tc.name)
		}

		s, v, err := agg.Load(ctx, tx, uuid.NewString(), framework.AsOf{})
		require.NoError(t, err)
		require.Equal(t, counter{}, s, "a missing stream folds to the zero state")
		require.Zero(t, v)

		s, v, err = agg.LoadForWriting(ctx, tx, id)
		require.NoError(t, err)
		require.Equal(t, counter{111, 3}, s)
		require.EqualValues(t, 3, v)
		return nil
	})
	require.NoError(t, err)

	// Another tenant's transaction does not see the stream at all.
	_, err = b.rt.InTx(ctx, "t2", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		s, v, err := agg.Load(ctx, tx, id, framework.AsOf{})
		require.Equal(t, counter{}, s)
		require.Zero(t, v)
		return err
	})
	require.NoError(t, err)
}

// FetchForWriting returns the stream's version; appending with a stale
// expected version fails with *ConcurrencyError (version_conflict, 409)
// and nothing of the command persists.
func TestStaleExpectedVersionConflicts(t *testing.T) {
	t.Parallel()
	var fetched int64
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) { registerNote(r, &fetched) })
	call := callAs("t1", "alice")
	id := b.place(t, "t1", "ada")

	// A client read version 1; someone else appends version 2 meanwhile.
	_, err := b.write(t, call, "tx-test:write:note", noteInput{OrderID: id, ExpectedVersion: 1, Customer: "bob"})
	require.NoError(t, err)
	require.EqualValues(t, 1, fetched)

	// The client's write with its stale version 1.
	_, err = b.write(t, call, "tx-test:write:note", noteInput{OrderID: id, ExpectedVersion: 1, Customer: "carol"})
	require.EqualValues(t, 2, fetched, "FetchForWriting saw the current version")
	var ce *framework.ConcurrencyError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, orders.StreamType, ce.Stream.Type)
	require.Equal(t, id, ce.Stream.ID)
	require.EqualValues(t, 1, ce.Expected)
	require.EqualValues(t, 2, ce.Actual)

	e := framework.ToError(err)
	require.Equal(t, framework.CodeVersionConflict, e.Code)
	require.Equal(t, http.StatusConflict, e.Code.HTTPStatus())
	require.Equal(t, map[string]any{"stream": "order/" + id, "expectedVersion": int64(1), "actualVersion": int64(2)}, e.Details)

	// Nothing of the failed command persisted: not its business update, not
	// its event, not the stream's version.
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM orders WHERE customer = 'bob'`))
	require.Equal(t, int64(2), b.count(t, `SELECT count(*) FROM events`))
	require.Equal(t, int64(2), b.count(t, `SELECT version FROM streams WHERE stream_id = $1`, id))

	// The right version still works.
	_, err = b.write(t, call, "tx-test:write:note", noteInput{OrderID: id, ExpectedVersion: 2, Customer: "carol"})
	require.NoError(t, err)
	require.Equal(t, int64(3), b.count(t, `SELECT version FROM streams WHERE stream_id = $1`, id))
}

// A NoStream append to a stream that exists is a version_conflict that
// rolls back the whole write, the business row included; another tenant's
// stream of the same id is no conflict.
func TestNewStreamThatExistsConflicts(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		framework.Write(r.Feature("tx-test"), "place-as", func(ctx context.Context, tx *framework.Tx, in struct {
			ID string `json:"id"`
		}) (string, error) {
			if _, err := tx.Exec(ctx, insertOrderSQL, tx.TenantID(), uuid.NewString(), "ada", 1); err != nil {
				return "", err
			}
			return in.ID, tx.Append(orderStream(in.ID), framework.NoStream, o.Placed.With(orders.Placed{OrderID: in.ID, Customer: "ada"}))
		}, nil)
	})
	id := uuid.NewString()
	in := map[string]string{"id": id}
	_, err := b.write(t, callAs("t1", "alice"), "tx-test:write:place-as", in)
	require.NoError(t, err)

	_, err = b.write(t, callAs("t1", "alice"), "tx-test:write:place-as", in)
	var ce *framework.ConcurrencyError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, framework.NoStream, ce.Expected)
	e := framework.ToError(err)
	require.Equal(t, framework.CodeVersionConflict, e.Code)
	require.Equal(t, "stream order/"+id+" exists, expected a new stream", e.Message)
	require.Equal(t, map[string]any{"stream": "order/" + id, "expectedVersion": framework.NoStream}, e.Details)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM orders`), "the second order row was rolled back")
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM events`))

	_, err = b.write(t, callAs("t2", "bob"), "tx-test:write:place-as", in)
	require.NoError(t, err, "stream ids are per tenant")
	require.Equal(t, int64(2), b.count(t, `SELECT count(*) FROM streams WHERE stream_id = $1`, id))
}

// Two writers race for one stream: A holds the stream with
// FetchForWriting; B, carrying the version A started from, waits on the
// lock and then fails with a conflict instead of writing version 3 twice.
func TestConcurrentWriterConflictsAfterLockWait(t *testing.T) {
	t.Parallel()
	var fetched int64
	var ev framework.EventType[noted]
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) { ev = registerNote(r, &fetched) })
	id := b.place(t, "t1", "ada")
	ctx := t.Context()

	var errB error
	doneB := make(chan struct{})
	cmdB := command(t, "tx-test:write:note", noteInput{OrderID: id, ExpectedVersion: 1, Customer: "bob"})
	_, err := b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		_, v, err := tx.FetchForWriting(ctx, orderStream(id))
		if err != nil {
			return err
		}
		require.EqualValues(t, 1, v)
		go func() {
			defer close(doneB)
			_, errB = b.rt.Write(ctx, callAs("t1", "bob"), []framework.Command{cmdB})
		}()
		waitForLockWaiter(t, b.db)
		return tx.Append(orderStream(id), v, ev.With(noted{Text: "a"}))
	})
	require.NoError(t, err)
	<-doneB
	var ce *framework.ConcurrencyError
	require.ErrorAs(t, errB, &ce)
	require.EqualValues(t, 1, ce.Expected)
	require.EqualValues(t, 2, ce.Actual)
	require.EqualValues(t, 2, fetched, "B's FetchForWriting waited for A's commit")
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM orders WHERE customer = 'bob'`))
	require.Equal(t, int64(2), b.count(t, `SELECT count(*) FROM events`))
}

// waitForLockWaiter waits until a session of db waits on a row lock.
// registerOrderCustomers declares the inline projection tx-test tests
// read back: a row in order_customers for every order placed.
func registerOrderCustomers(f *framework.Feature, o *orders.Feature) {
	p := framework.InlineProjection(f, "order-customers")
	framework.On(p, o.Placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[orders.Placed]) error {
		_, err := tx.Exec(ctx, `INSERT INTO order_customers (tenant_id, order_id, customer, version) VALUES ($1, $2, $3, $4)`,
			e.TenantID, e.Payload.OrderID, e.Payload.Customer, e.Version)
		return err
	})
}

func waitForLockWaiter(t *testing.T, db *kumikotest.DB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		require.NoError(t, db.Pool.QueryRow(t.Context(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND wait_event_type = 'Lock'`, db.Name).Scan(&n))
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session waits on the stream lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Transactions appending to the same streams in opposite call order never
// deadlock: buffered appends are locked in sorted stream order at flush.
func TestMultiStreamAppendsNeverDeadlock(t *testing.T) {
	t.Parallel()
	var ev framework.EventType[noted]
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) { ev = registerNote(r, nil) })
	const rounds = 200
	callOrders := [][]string{{"x", "y"}, {"y", "x"}}
	errs := make(chan error, rounds*len(callOrders))
	var wg sync.WaitGroup
	for i := range rounds {
		for _, order := range callOrders {
			wg.Go(func() {
				_, err := b.rt.InTx(t.Context(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
					for _, s := range order {
						if err := tx.Append(framework.Stream{Type: "pair", ID: s}, framework.AnyVersion,
							ev.With(noted{Text: fmt.Sprintf("%d %v", i, order)})); err != nil {
							return err
						}
					}
					return nil
				})
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(2*rounds), b.count(t, `SELECT version FROM streams WHERE stream_type = 'pair' AND stream_id = 'x'`))
	require.Equal(t, int64(2*rounds), b.count(t, `SELECT version FROM streams WHERE stream_type = 'pair' AND stream_id = 'y'`))
	require.Equal(t, int64(4*rounds), b.count(t, `SELECT count(*) FROM events`))
	// Versions are gapless per stream.
	require.Equal(t, int64(2*rounds), b.count(t, `SELECT count(DISTINCT version) FROM events WHERE stream_id = 'x'`))
}

const orderCustomersSchema = `CREATE TABLE order_customers (
	tenant_id text NOT NULL,
	order_id  uuid NOT NULL,
	customer  text NOT NULL,
	version   bigint NOT NULL,
	PRIMARY KEY (tenant_id, order_id)
);
SELECT kumiko_enable_tenancy('order_customers');`

// inlineSeen records what an inline projection observed.
type inlineSeen struct {
	rowInTx, rowOutside int64
	version             int64
	tenant              string
	meta                framework.Metadata
}

// An inline projection runs in the write transaction: it sees the
// handler's uncommitted row, its own write commits with the write, and its
// error rolls the whole write back.
func TestInlineProjectionRunsInWriteTx(t *testing.T) {
	t.Parallel()
	var pool *pgxpool.Pool
	var seen []inlineSeen
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		p := framework.InlineProjection(r.Feature("tx-test"), "order-customers")
		framework.On(p, o.Placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[orders.Placed]) error {
			s := inlineSeen{version: e.Version, tenant: e.TenantID, meta: e.Metadata}
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = $1`, e.Payload.OrderID).Scan(&s.rowInTx); err != nil {
				return err
			}
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE id = $1`, e.Payload.OrderID).Scan(&s.rowOutside); err != nil {
				return err
			}
			seen = append(seen, s)
			_, err := tx.Exec(ctx, `INSERT INTO order_customers (tenant_id, order_id, customer, version) VALUES ($1, $2, $3, $4)`,
				e.TenantID, e.Payload.OrderID, e.Payload.Customer, e.Version)
			return err
		})
	}, orderCustomersSchema)
	pool = b.db.Pool

	id := b.place(t, "t1", "ada")
	require.Len(t, seen, 1)
	require.Equal(t, inlineSeen{rowInTx: 1, rowOutside: 0, version: 1, tenant: "t1",
		meta: framework.Metadata{UserID: "u-t1", RequestID: "req-u-t1", CorrelationID: "req-u-t1", CausationID: "req-u-t1"}}, seen[0],
		"the projection sees the uncommitted order; other connections do not")
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM order_customers WHERE order_id = $1 AND customer = 'ada' AND tenant_id = 't1'`, id))

	// Events appended through InTx run the inline projections too.
	other := uuid.NewString()
	_, err := b.rt.InTx(t.Context(), "t2", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		return tx.Append(orderStream(other), framework.NoStream, b.orders.Placed.With(orders.Placed{OrderID: other, Customer: "bob"}))
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM order_customers WHERE order_id = $1 AND tenant_id = 't2'`, other))
}

func TestInlineProjectionErrorRollsBackWrite(t *testing.T) {
	t.Parallel()
	refused := errors.New("projection refused")
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		p := framework.InlineProjection(r.Feature("tx-test"), "order-customers")
		framework.On(p, o.Placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[orders.Placed]) error {
			if _, err := tx.Exec(ctx, `INSERT INTO order_customers (tenant_id, order_id, customer, version) VALUES ($1, $2, $3, $4)`,
				e.TenantID, e.Payload.OrderID, e.Payload.Customer, e.Version); err != nil {
				return err
			}
			return refused
		})
	}, orderCustomersSchema)

	_, err := b.write(t, callAs("t1", "alice"), "orders:write:place", orders.PlaceInput{Customer: "ada", AmountCents: 1})
	require.ErrorIs(t, err, refused)
	require.ErrorContains(t, err, "projection tx-test:order-customers: orders:event:placed")
	require.Equal(t, framework.CodeInternal, framework.ToError(err).Code)
	b.requireNothingPersisted(t)
	require.Zero(t, b.count(t, `SELECT count(*) FROM order_customers`))
}

// Events a handler appends and then flushes by reading (ReadStream,
// Aggregate.Load, FetchForWriting or an explicit Flush) must still reach
// the inline projections before commit.
func TestInlineProjectionSeesEventsFlushedByReads(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		f := r.Feature("tx-test")
		registerOrderCustomers(f, o)
		framework.Write(f, "place-and-read", func(ctx context.Context, tx *framework.Tx, _ struct{}) (string, error) {
			id := uuid.NewString()
			if err := tx.Append(orderStream(id), framework.NoStream, o.Placed.With(orders.Placed{OrderID: id, Customer: "ada"})); err != nil {
				return "", err
			}
			// Read the stream back, e.g. to answer the new state.
			_, err := tx.ReadStream(ctx, orderStream(id), framework.AsOf{})
			return id, err
		}, nil)
	}, orderCustomersSchema)

	out, err := b.write(t, callAs("t1", "alice"), "tx-test:write:place-and-read", struct{}{})
	require.NoError(t, err)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM events WHERE stream_id = $1`, out))
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM order_customers WHERE order_id = $1`, out),
		"the inline projection ran for the flushed event")

	// The same through InTx with an explicit Flush.
	id := uuid.NewString()
	_, err = b.rt.InTx(t.Context(), "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		if err := tx.Append(orderStream(id), framework.NoStream, b.orders.Placed.With(orders.Placed{OrderID: id, Customer: "bob"})); err != nil {
			return err
		}
		_, err := tx.Flush(ctx)
		return err
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM order_customers WHERE order_id = $1`, id))
}

// An event appended by an inline projection was caused by the event the
// projection handles, as one appended by a multi-stream projection is: its
// causation id is that event's id (README, the event log's metadata), not
// the request id of the write it runs in; the correlation id stays the
// write's. Tx.CausationID says so inside the projection.
func TestInlineProjectionAppendsAreCausedByTheirEvent(t *testing.T) {
	t.Parallel()
	var inProjection []string
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		f := r.Feature("tx-test")
		ev := framework.DefineEvent[noted](f, "noted", nil)
		p := framework.InlineProjection(f, "order-notes")
		framework.On(p, o.Placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[orders.Placed]) error {
			inProjection = append(inProjection, tx.CausationID())
			return tx.Append(framework.Stream{Type: "note", ID: e.Payload.OrderID}, framework.NoStream, ev.With(noted{Text: "placed"}))
		})
	})
	id := b.place(t, "t1", "ada")
	var placedAt int64
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT position FROM events WHERE stream_type = 'order' AND stream_id = $1`, id).Scan(&placedAt))
	var m framework.Metadata
	require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT metadata FROM events WHERE stream_type = 'note' AND stream_id = $1`, id).Scan(&m))
	cause := fmt.Sprint(placedAt)
	require.Equal(t, framework.Metadata{UserID: "u-t1", RequestID: "req-u-t1", CorrelationID: "req-u-t1", CausationID: cause}, m)
	require.Equal(t, []string{cause}, inProjection)

	// The handler's own later appends are the request's again.
	var after string
	_, err := b.rt.InTx(t.Context(), "t1", framework.Metadata{CausationID: "job-1"}, func(ctx context.Context, tx *framework.Tx) error {
		other := uuid.NewString()
		if err := tx.Append(orderStream(other), framework.NoStream, b.orders.Placed.With(orders.Placed{OrderID: other, Customer: "bob"})); err != nil {
			return err
		}
		if _, err := tx.Flush(ctx); err != nil {
			return err
		}
		after = tx.CausationID()
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "job-1", after)
}

// A write of buffered events that failed (here a version conflict) fails
// the transaction for good, as a failed inline projection does (Flush: the
// transaction must then be rolled back), also when the handler goes on
// past the error: with a savepoint rolled back, an event it appended
// before the savepoint but that was buffered until the failed flush would
// be lost while the write answered success, and its inline projection's
// row committed for an event the log does not hold.
func TestFailedFlushFailsTheWriteEvenWhenIgnored(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		f := r.Feature("tx-test")
		registerOrderCustomers(f, o)
		framework.Write(f, "try-create", func(ctx context.Context, tx *framework.Tx, in struct {
			Existing string `json:"existing"`
		}) (struct{}, error) {
			id := uuid.NewString()
			if err := tx.Append(orderStream(id), framework.NoStream, o.Placed.With(orders.Placed{OrderID: id, Customer: "kept"})); err != nil {
				return struct{}{}, err
			}
			if _, err := tx.Exec(ctx, "SAVEPOINT try_create"); err != nil {
				return struct{}{}, err
			}
			if err := tx.Append(orderStream(in.Existing), framework.NoStream, o.Placed.With(orders.Placed{OrderID: in.Existing, Customer: "again"})); err != nil {
				return struct{}{}, err
			}
			_, err := tx.Flush(ctx)
			if _, ok := errors.AsType[*framework.ConcurrencyError](err); !ok {
				return struct{}{}, err
			}
			// The stream exists: undo the attempt and go on.
			_, err = tx.Exec(ctx, "ROLLBACK TO SAVEPOINT try_create")
			return struct{}{}, err
		}, nil)
	}, orderCustomersSchema)
	existing := b.place(t, "t1", "ada")
	events, rows := b.count(t, `SELECT count(*) FROM events`), b.count(t, `SELECT count(*) FROM order_customers`)

	_, err := b.write(t, callAs("t1", "alice"), "tx-test:write:try-create", map[string]string{"existing": existing})
	require.Error(t, err)
	require.Equal(t, framework.CodeVersionConflict, framework.ToError(err).Code, "%v", err)
	require.Equal(t, events, b.count(t, `SELECT count(*) FROM events`))
	require.Equal(t, rows, b.count(t, `SELECT count(*) FROM order_customers`), "no projection row without its event")
}

// hookedInput is the payload of tx-test:write:hooked; FailAt names the
// step that fails.
type hookedInput struct {
	Customer string `json:"customer" validate:"required"`
	FailAt   string `json:"failAt" validate:"omitempty,oneof=validate presave handler postsave"`
}

// registerHooked registers tx-test:write:hooked with every hook; each step
// appends its name to log. PostSave also records how many events of the
// order it sees (they must be written by then).
func registerHooked(r *framework.Registry, o *orders.Feature, log *[]string) {
	step := func(name, failAt string) error {
		*log = append(*log, name)
		if name == failAt {
			return fmt.Errorf("%s refused", name)
		}
		return nil
	}
	framework.Write(r.Feature("tx-test"), "hooked", func(ctx context.Context, tx *framework.Tx, in hookedInput) (string, error) {
		if err := step("handler", in.FailAt); err != nil {
			return "", err
		}
		id := uuid.NewString()
		if _, err := tx.Exec(ctx, insertOrderSQL, tx.TenantID(), id, in.Customer, 1); err != nil {
			return "", err
		}
		return id, tx.Append(orderStream(id), framework.NoStream, o.Placed.With(orders.Placed{OrderID: id, Customer: in.Customer}))
	}, &framework.WriteOptions[hookedInput, string]{
		Validate: func(ctx context.Context, tx *framework.Tx, in hookedInput) error {
			*log = append(*log, "validate")
			if in.FailAt == "validate" {
				return &framework.ValidationError{Fields: []framework.FieldError{{Field: "customer", Rule: "blocked", Message: "customer is blocked"}}}
			}
			return nil
		},
		PreSave: func(ctx context.Context, tx *framework.Tx, in hookedInput) error { return step("presave", in.FailAt) },
		PostSave: func(ctx context.Context, tx *framework.Tx, in hookedInput, out string) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM events WHERE stream_id = $1`, out).Scan(&n); err != nil {
				return err
			}
			*log = append(*log, fmt.Sprintf("postsave:events=%d", n))
			if in.FailAt == "postsave" {
				return errors.New("postsave refused")
			}
			return nil
		},
		AfterCommit: func(ctx context.Context, in hookedInput, out string) {
			*log = append(*log, "aftercommit:"+in.Customer)
		},
	})
}

// Hooks run in order Validate, PreSave, handler, PostSave (events already
// written), commit, AfterCommit; a failure anywhere rolls everything back
// and AfterCommit never runs for a rolled back write.
func TestWriteHooksRunInOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		failAt string
		log    []string
	}{
		{"", []string{"validate", "presave", "handler", "postsave:events=1", "aftercommit:ada"}},
		{"validate", []string{"validate"}},
		{"presave", []string{"validate", "presave"}},
		{"handler", []string{"validate", "presave", "handler"}},
		{"postsave", []string{"validate", "presave", "handler", "postsave:events=1"}},
	} {
		t.Run("fail at "+tc.failAt, func(t *testing.T) {
			t.Parallel()
			var log []string
			b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) { registerHooked(r, o, &log) })
			out, err := b.write(t, callAs("t1", "alice"), "tx-test:write:hooked", hookedInput{Customer: "ada", FailAt: tc.failAt})
			require.Equal(t, tc.log, log)
			if tc.failAt == "" {
				require.NoError(t, err)
				require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM orders WHERE id = $1`, out))
				require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM events WHERE stream_id = $1`, out))
				return
			}
			require.Error(t, err)
			if tc.failAt == "validate" {
				var ve *framework.ValidationError
				require.ErrorAs(t, err, &ve)
			}
			b.requireNothingPersisted(t)
		})
	}
}

// In a batch, AfterCommit hooks run only once the whole batch committed,
// and not at all when a later command fails.
func TestWriteHooksInBatch(t *testing.T) {
	t.Parallel()
	var log []string
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) { registerHooked(r, o, &log) })
	call := callAs("t1", "alice")

	_, err := b.rt.Write(t.Context(), call, []framework.Command{
		command(t, "tx-test:write:hooked", hookedInput{Customer: "ada"}),
		command(t, "tx-test:write:hooked", hookedInput{Customer: "bob", FailAt: "postsave"}),
	})
	var be *framework.BatchError
	require.ErrorAs(t, err, &be)
	require.Equal(t, 1, be.Index)
	require.Equal(t, []string{
		"validate", "presave", "handler", "postsave:events=1",
		"validate", "presave", "handler", "postsave:events=1",
	}, log, "no AfterCommit for the rolled back batch")
	b.requireNothingPersisted(t)

	log = nil
	res, err := b.rt.Write(t.Context(), call, []framework.Command{
		command(t, "tx-test:write:hooked", hookedInput{Customer: "ada"}),
		command(t, "tx-test:write:hooked", hookedInput{Customer: "bob"}),
	})
	require.NoError(t, err)
	require.Len(t, res, 2)
	require.Equal(t, []string{
		"validate", "presave", "handler", "postsave:events=1",
		"validate", "presave", "handler", "postsave:events=1",
		"aftercommit:ada", "aftercommit:bob",
	}, log)
	require.Equal(t, int64(2), b.count(t, `SELECT count(*) FROM orders`))
}

// A batch runs all commands in one transaction: when the second of three
// fails, the error is a *BatchError with Index 1 and nothing persists.
func TestBatchIsAllOrNothing(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, nil)
	call := callAs("t1", "alice")
	place := func(customer string) framework.Command {
		return command(t, "orders:write:place", map[string]any{"customer": customer, "amountCents": 1})
	}

	_, err := b.rt.Write(t.Context(), call, []framework.Command{place("ada"), place(""), place("carol")})
	var be *framework.BatchError
	require.ErrorAs(t, err, &be)
	require.Equal(t, 1, be.Index)
	var ve *framework.ValidationError
	require.ErrorAs(t, err, &ve)
	e := framework.ToError(err)
	require.Equal(t, framework.CodeValidation, e.Code)
	require.Equal(t, 1, e.Details.(map[string]any)["index"])
	require.Equal(t, "command 1: validation failed: customer is required", e.Message)
	b.requireNothingPersisted(t)

	// A handler error (not a validation error) in the middle: same outcome.
	_, err = b.rt.Write(t.Context(), call, []framework.Command{
		place("ada"),
		command(t, "orders:write:cancel", orders.CancelInput{OrderID: uuid.NewString(), ExpectedVersion: 1}),
		place("carol"),
	})
	require.ErrorAs(t, err, &be)
	require.Equal(t, 1, be.Index)
	require.ErrorIs(t, err, framework.ErrNotFound)
	b.requireNothingPersisted(t)

	// An unknown type is found before anything runs.
	_, err = b.rt.Write(t.Context(), call, []framework.Command{place("ada"), {Type: "orders:write:nope"}, place("carol")})
	require.ErrorAs(t, err, &be)
	require.Equal(t, 1, be.Index)
	require.Equal(t, framework.CodeNotFound, framework.ToError(err).Code)
	b.requireNothingPersisted(t)

	res, err := b.rt.Write(t.Context(), call, []framework.Command{place("ada"), place("bob"), place("carol")})
	require.NoError(t, err)
	require.Len(t, res, 3)
	require.Equal(t, int64(3), b.count(t, `SELECT count(*) FROM orders`))
	require.Equal(t, int64(3), b.count(t, `SELECT count(*) FROM events`))
}

// A version conflict that surfaces when a batch's buffered appends are
// written (at commit) must still name the command that caused it.
func TestBatchConflictAtCommitNamesCommand(t *testing.T) {
	t.Parallel()
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) { registerNote(r, nil) })
	call := callAs("t1", "alice")
	id := b.place(t, "t1", "ada")
	_, err := b.write(t, call, "tx-test:write:note", noteInput{OrderID: id, ExpectedVersion: 1, Customer: "bob"})
	require.NoError(t, err)

	_, err = b.rt.Write(t.Context(), call, []framework.Command{
		command(t, "orders:write:place", orders.PlaceInput{Customer: "dan"}),
		command(t, "tx-test:write:note", noteInput{OrderID: id, ExpectedVersion: 1, Customer: "carol"}),
		command(t, "orders:write:place", orders.PlaceInput{Customer: "eve"}),
	})
	var ce *framework.ConcurrencyError
	require.ErrorAs(t, err, &ce)
	var be *framework.BatchError
	require.ErrorAs(t, err, &be)
	require.Equal(t, 1, be.Index)
	require.Equal(t, 1, framework.ToError(err).Details.(map[string]any)["index"])
	require.Equal(t, int64(1), b.count(t, `SELECT count(*) FROM orders`))
}

// Every event carries the caller's user id and the request, correlation
// and causation ids; correlation and causation default to the request id.
func TestEventMetadata(t *testing.T) {
	t.Parallel()
	var inHandler []framework.Metadata
	b := newRTBundle(t, func(r *framework.Registry, o *orders.Feature) {
		framework.Write(r.Feature("tx-test"), "whoami", func(ctx context.Context, tx *framework.Tx, _ struct{}) (struct{}, error) {
			inHandler = append(inHandler, framework.Metadata{UserID: tx.UserID(), RequestID: tx.RequestID(),
				CorrelationID: tx.CorrelationID(), CausationID: tx.CausationID()})
			id := uuid.NewString()
			return struct{}{}, tx.Append(orderStream(id), framework.NoStream, o.Placed.With(orders.Placed{OrderID: id, Customer: "ada"}))
		}, nil)
	})
	readMeta := func(t *testing.T) framework.Metadata {
		t.Helper()
		var m framework.Metadata
		require.NoError(t, b.db.Pool.QueryRow(t.Context(), `SELECT metadata FROM events ORDER BY position DESC LIMIT 1`).Scan(&m))
		return m
	}

	call := framework.Call{
		Principal: framework.Principal{UserID: "alice", TenantID: "t1"}, RequestID: "req-1", IdempotencyKey: "idem-1",
		IdempotencyOwner: "owner-2", IdempotencyReclaimedFrom: "owner-1",
	}
	_, err := b.write(t, call, "tx-test:write:whoami", struct{}{})
	require.NoError(t, err)
	want := framework.Metadata{UserID: "alice", RequestID: "req-1", CorrelationID: "req-1", CausationID: "req-1", IdempotencyKey: "idem-1",
		IdempotencyOwner: "owner-2", IdempotencyReclaimedFrom: "owner-1"}
	require.Equal(t, want, readMeta(t))
	require.Equal(t, framework.Metadata{UserID: "alice", RequestID: "req-1", CorrelationID: "req-1", CausationID: "req-1"}, inHandler[0])

	call = framework.Call{
		Principal: framework.Principal{UserID: "bob", TenantID: "t1"}, RequestID: "req-2",
		CorrelationID: "corr-2", CausationID: "cause-2",
	}
	_, err = b.write(t, call, "tx-test:write:whoami", struct{}{})
	require.NoError(t, err)
	require.Equal(t, framework.Metadata{UserID: "bob", RequestID: "req-2", CorrelationID: "corr-2", CausationID: "cause-2"}, readMeta(t))

	// The sample feature's write carries the same metadata.
	b.place(t, "t1", "carol")
	require.Equal(t, framework.Metadata{UserID: "u-t1", RequestID: "req-u-t1", CorrelationID: "req-u-t1", CausationID: "req-u-t1"}, readMeta(t))

	// InTx stores the metadata it is given, as is (system work).
	id := uuid.NewString()
	sys := framework.Metadata{CorrelationID: "corr-job", CausationID: "42"}
	_, err = b.rt.InTx(t.Context(), "t1", sys, func(ctx context.Context, tx *framework.Tx) error {
		require.Equal(t, "42", tx.CausationID())
		require.Empty(t, tx.UserID())
		return tx.Append(orderStream(id), framework.NoStream, b.orders.Placed.With(orders.Placed{OrderID: id, Customer: "job"}))
	})
	require.NoError(t, err)
	require.Equal(t, sys, readMeta(t))
}

// TestNewerEventVersionIsRefused: an event stored at a schema version above
// the one this code declares (written by a newer release while this one
// still runs, during a rolling deploy) cannot be read correctly by this
// code: its payload is of a shape the code has never seen (a renamed field
// decodes to its zero value). Every read refuses it with
// ErrNewerEventVersion, naming the event, instead of folding a wrong state.
func TestNewerEventVersionIsRefused(t *testing.T) {
	t.Parallel()
	var named framework.EventType[personV2]
	agg := framework.NewAggregate[[]string]("person")
	b := newRTBundle(t, func(r *framework.Registry, _ *orders.Feature) {
		// This release knows version 1 only ("fullName"); the next one
		// renamed the field to "displayName" and declared version 2.
		named = framework.DefineEvent[personV2](r.Feature("tx-test"), "person-named", nil)
		framework.Evolve(agg, named, func(s *[]string, e framework.Event[personV2]) { *s = append(*s, e.Payload.FullName) })
	})
	id := uuid.NewString()
	ctx := t.Context()
	_, err := eventstore.Append(ctx, b.db.Pool, eventstore.StreamRef{TenantID: "t1", Type: "person", ID: id}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: named.Name(), TypeVersion: 2, Payload: json.RawMessage(`{"displayName":"Ada Lovelace"}`)}})
	require.NoError(t, err)
	_, err = b.rt.InTx(ctx, "t1", framework.Metadata{}, func(ctx context.Context, tx *framework.Tx) error {
		names, _, err := agg.Load(ctx, tx, id, framework.AsOf{})
		require.ErrorIs(t, err, framework.ErrNewerEventVersion, "folded %q", names)
		require.Regexp(t, `tx-test:event:person-named at \d+: stored at version 2, this code declares version 1`, err)

		envs, err := tx.ReadStream(ctx, agg.Stream(id), framework.AsOf{})
		require.NoError(t, err)
		_, _, err = named.Decode(envs[0])
		require.ErrorIs(t, err, framework.ErrNewerEventVersion)
		_, err = b.rt.Registry().UpcastPayload(envs[0])
		require.ErrorIs(t, err, framework.ErrNewerEventVersion)
		return nil
	})
	require.NoError(t, err)

	// A write handler folding such a stream fails (500), and writes nothing.
	order := uuid.NewString()
	_, err = eventstore.Append(ctx, b.db.Pool, eventstore.StreamRef{TenantID: "t1", Type: orders.StreamType, ID: order}, eventstore.NoStream,
		[]eventstore.NewEvent{{Type: b.orders.Placed.Name(), TypeVersion: 2, Payload: json.RawMessage(`{"order":{}}`)}})
	require.NoError(t, err)
	_, err = b.rt.Write(ctx, callAs("t1", "u1"), []framework.Command{command(t, "orders:write:cancel",
		map[string]any{"orderId": order, "expectedVersion": 1})})
	require.ErrorIs(t, err, framework.ErrNewerEventVersion)
	require.Equal(t, framework.CodeInternal, framework.ToError(err).Code)
}
