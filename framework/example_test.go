package framework_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kumiko-go/kumiko/framework"
)

// shopPlaced is the payload of the examples' shop:event:placed.
type shopPlaced struct {
	OrderID  string `json:"orderId" validate:"required"`
	Customer string `json:"customer" validate:"required,max=20"`
	Cents    int64  `json:"cents" validate:"gte=0"`
}

// shopCancelled is the payload of the examples' shop:event:cancelled.
type shopCancelled struct {
	OrderID string `json:"orderId" validate:"required"`
}

// shopPlaceInput is the payload of the examples' shop:write:place.
type shopPlaceInput struct {
	Customer string `json:"customer" validate:"required,max=20"`
	Cents    int64  `json:"cents" validate:"gte=0"`
}

// shopOrder is the examples' order aggregate state.
type shopOrder struct {
	Customer  string
	Cents     int64
	Cancelled bool
}

// envelope builds a stored event by hand, as the event store would return it.
func envelope(typ string, version int64, payload string) framework.Envelope {
	return framework.Envelope{
		Position: version, TenantID: "acme", StreamType: "order", StreamID: "o-1",
		Version: version, Type: typ, TypeVersion: 1, Payload: json.RawMessage(payload),
	}
}

func ExampleDefineEvent() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")

	// Keep the handle in a package variable: it appends and subscribes.
	placed := framework.DefineEvent[shopPlaced](shop, "placed", nil)
	fmt.Println(placed.Name(), "version", placed.Version())

	pending := placed.With(shopPlaced{OrderID: "o-1", Customer: "Ada", Cents: 1200})
	fmt.Println("pending:", pending.Type())

	// Decode turns a stored envelope of this type into a typed event.
	e, ok, err := placed.Decode(envelope("shop:event:placed", 1, `{"orderId":"o-1","customer":"Ada","cents":1200}`))
	fmt.Println(ok, err, e.Payload.Customer, e.Payload.Cents, e.Stream)

	// An envelope of another type is not this event.
	_, ok, err = placed.Decode(envelope("shop:event:cancelled", 2, `{"orderId":"o-1"}`))
	fmt.Println(ok, err)
	fmt.Println("build:", r.Build())
	// Output:
	// shop:event:placed version 1
	// pending: shop:event:placed
	// true <nil> Ada 1200 order/o-1
	// false <nil>
	// build: <nil>
}

func ExampleDefineEvent_upcaster() {
	// Version 1 stored {"name": ...}; version 2 renamed it to fullName.
	type renamedV2 struct {
		FullName string `json:"fullName" validate:"required"`
	}
	r := framework.NewRegistry()
	renamed := framework.DefineEvent[renamedV2](r.Feature("people"), "renamed", &framework.EventOptions{
		Version: 2,
		Upcasters: map[int]framework.Upcaster{
			1: func(p json.RawMessage) (json.RawMessage, error) {
				var v1 struct {
					Name string `json:"name"`
				}
				if err := json.Unmarshal(p, &v1); err != nil {
					return nil, err
				}
				return json.Marshal(renamedV2{FullName: v1.Name})
			},
		},
	})
	fmt.Println("build:", r.Build())

	// A row written at version 1 is upcast on read; the stored row is not
	// rewritten.
	old := framework.Envelope{Type: "people:event:renamed", TypeVersion: 1, Payload: json.RawMessage(`{"name":"Ada Lovelace"}`)}
	e, ok, err := renamed.Decode(old)
	fmt.Println(ok, err, e.Payload.FullName)
	up, _ := r.UpcastPayload(old)
	fmt.Println(string(up), string(old.Payload))

	// Forgetting an upcaster fails the boot.
	r2 := framework.NewRegistry()
	framework.DefineEvent[renamedV2](r2.Feature("people"), "renamed", &framework.EventOptions{Version: 2})
	fmt.Println(r2.Build())
	// Output:
	// build: <nil>
	// true <nil> Ada Lovelace
	// {"fullName":"Ada Lovelace"} {"name":"Ada Lovelace"}
	// kumiko: event people:event:renamed: version 1 has no upcaster to 2
}

func ExampleWrite() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	placed := framework.DefineEvent[shopPlaced](shop, "placed", nil)

	framework.Write(shop, "place", func(ctx context.Context, tx *framework.Tx, in shopPlaceInput) (string, error) {
		id := "o-1" // a real handler inserts its business row with tx.Exec
		err := tx.Append(framework.Stream{Type: "order", ID: id}, framework.NoStream,
			placed.With(shopPlaced{OrderID: id, Customer: in.Customer, Cents: in.Cents}))
		return id, err
	}, &framework.WriteOptions[shopPlaceInput, string]{
		Roles: []string{"clerk"},
		Validate: func(ctx context.Context, tx *framework.Tx, in shopPlaceInput) error {
			if in.Customer == "Mallory" {
				return &framework.ValidationError{Fields: []framework.FieldError{{Field: "customer", Rule: "blocked", Message: "customer is blocked"}}}
			}
			return nil
		},
	})
	fmt.Println(r.WriteTypes(), r.Build())

	// The runtime decodes every command payload strictly before the handler
	// runs; a bad one is a *ValidationError listing each failed field.
	var in shopPlaceInput
	err := framework.DecodePayload(json.RawMessage(`{"cents":-5}`), &in)
	var ve *framework.ValidationError
	if errors.As(err, &ve) {
		for _, f := range ve.Fields {
			fmt.Printf("%s %s: %s\n", f.Field, f.Rule, f.Message)
		}
	}
	e := framework.ToError(err)
	fmt.Println(e.Code, e.Code.HTTPStatus())

	err = framework.DecodePayload(json.RawMessage(`{"customer":"Ada","colour":"red"}`), &in)
	fmt.Println(err)
	err = framework.DecodePayload(json.RawMessage(`{"customer":"Ada","cents":"lots"}`), &in)
	fmt.Println(err)
	// Output:
	// [shop:write:place] <nil>
	// customer required: customer is required
	// cents gte: cents must be >= 0
	// validation_error 400
	// validation failed: unknown field "colour"
	// validation failed: cents must be of type integer, got string
}

func ExampleQuery() {
	type getInput struct {
		OrderID string `json:"orderId" validate:"required"`
	}
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	framework.Query(shop, "get", func(ctx context.Context, tx *framework.Tx, in getInput) (shopOrder, error) {
		var o shopOrder
		err := tx.QueryRow(ctx, `SELECT customer, cents FROM shop_orders WHERE id = $1`, in.OrderID).Scan(&o.Customer, &o.Cents)
		return o, err
	}, &framework.QueryOptions{Roles: []string{"clerk"}})
	framework.Query(shop, "list", func(ctx context.Context, tx *framework.Tx, _ struct{}) ([]shopOrder, error) {
		return nil, nil
	}, nil)
	fmt.Println(r.QueryTypes(), r.Build())

	var in getInput
	fmt.Println(framework.DecodePayload(json.RawMessage(`{}`), &in))
	// Output:
	// [shop:query:get shop:query:list] <nil>
	// validation failed: orderId is required
}

func ExampleInlineProjection() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	placed := framework.DefineEvent[shopPlaced](shop, "placed", nil)
	cancelled := framework.DefineEvent[shopCancelled](shop, "cancelled", nil)

	// Inline handlers run in the write transaction; a returned error rolls
	// the write back. Real ones write a table through tx.
	totals := framework.InlineProjection(shop, "totals")
	framework.On(totals, placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[shopPlaced]) error {
		fmt.Println("placed", e.Payload.OrderID, e.Payload.Cents, "at version", e.Version)
		return nil
	})
	framework.On(totals, cancelled, func(ctx context.Context, tx *framework.Tx, e framework.Event[shopCancelled]) error {
		return errors.New("refund first")
	})
	fmt.Println(totals.Name(), totals.Kind(), totals.EventTypes(), r.Build())

	ctx := context.Background()
	fmt.Println(totals.Apply(ctx, nil, envelope("shop:event:placed", 1, `{"orderId":"o-1","customer":"Ada","cents":1200}`)))
	fmt.Println(totals.Apply(ctx, nil, envelope("shop:event:cancelled", 2, `{"orderId":"o-1"}`)))
	fmt.Println(totals.Apply(ctx, nil, envelope("shop:event:shipped", 3, `{}`))) // not handled
	// Output:
	// shop:totals inline [shop:event:placed shop:event:cancelled] <nil>
	// placed o-1 1200 at version 1
	// <nil>
	// projection shop:totals: shop:event:cancelled at 2: refund first
	// <nil>
}

func ExampleOn() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	placed := framework.DefineEvent[shopPlaced](shop, "placed", nil)

	// On is typed by the event handle: the handler gets Event[shopPlaced].
	mail := framework.MultiStreamProjection(shop, "mailer", nil)
	framework.On(mail, placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[shopPlaced]) error {
		fmt.Println("mail", e.Payload.Customer, "about", e.Payload.OrderID)
		return nil
	})
	fmt.Println(r.Build())
	_ = mail.Apply(context.Background(), nil, envelope("shop:event:placed", 1, `{"orderId":"o-1","customer":"Ada","cents":1}`))

	// A handle declared in another registry (here: r), or the zero handle,
	// is not declared in this one: the boot fails.
	other := framework.NewRegistry()
	audit := framework.MultiStreamProjection(other.Feature("audit"), "trail", nil)
	framework.On(audit, placed, func(context.Context, *framework.Tx, framework.Event[shopPlaced]) error { return nil })
	framework.On(audit, framework.EventType[shopCancelled]{}, func(context.Context, *framework.Tx, framework.Event[shopCancelled]) error { return nil })
	fmt.Println(other.Build())
	// Output:
	// <nil>
	// mail Ada about o-1
	// kumiko: projection audit:trail handles undeclared event "shop:event:placed"
	// kumiko: projection audit:trail handles undeclared event ""
}

func ExampleMultiStreamProjection() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	placed := framework.DefineEvent[shopPlaced](shop, "placed", nil)

	revenue := framework.MultiStreamProjection(shop, "revenue", &framework.ProjectionOptions{Table: "shop_revenue"})
	framework.On(revenue, placed, func(ctx context.Context, tx *framework.Tx, e framework.Event[shopPlaced]) error {
		_, err := tx.Exec(ctx, `INSERT INTO shop_revenue (tenant_id, cents) VALUES ($1, $2)
			ON CONFLICT (tenant_id) DO UPDATE SET cents = shop_revenue.cents + EXCLUDED.cents`, e.TenantID, e.Payload.Cents)
		return err
	})
	hub := framework.MultiStreamProjection(shop, "live-hub", &framework.ProjectionOptions{
		Delivery: framework.DeliveryPerInstance, RunIn: framework.RunInAPI, MaxAttempts: 3,
	})
	framework.On(hub, placed, func(context.Context, *framework.Tx, framework.Event[shopPlaced]) error { return nil })
	fmt.Println(r.Build())
	for _, p := range r.Projections() {
		o := p.Options()
		fmt.Printf("%s %s table=%q delivery=%s runIn=%s maxAttempts=%d types=%v\n",
			p.Name(), p.Kind(), o.Table, o.Delivery, o.RunIn, o.MaxAttempts, p.EventTypes())
	}
	// Output:
	// <nil>
	// shop:live-hub multi-stream table="" delivery=per-instance runIn=api maxAttempts=3 types=[shop:event:placed]
	// shop:revenue multi-stream table="shop_revenue" delivery=shared runIn=worker maxAttempts=10 types=[shop:event:placed]
}

func ExampleNewAggregate() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	placed := framework.DefineEvent[shopPlaced](shop, "placed", nil)
	cancelled := framework.DefineEvent[shopCancelled](shop, "cancelled", nil)

	order := framework.NewAggregate[shopOrder]("order")
	framework.Evolve(order, placed, func(s *shopOrder, e framework.Event[shopPlaced]) {
		s.Customer, s.Cents = e.Payload.Customer, e.Payload.Cents
	})
	framework.Evolve(order, cancelled, func(s *shopOrder, _ framework.Event[shopCancelled]) { s.Cancelled = true })
	fmt.Println(order.StreamType(), order.Stream("o-1"))

	// Load and LoadForWriting read the stream in a transaction; Fold is the
	// pure part.
	s, version, err := order.Fold([]framework.Envelope{
		envelope("shop:event:placed", 1, `{"orderId":"o-1","customer":"Ada","cents":1200}`),
		envelope("shop:event:cancelled", 2, `{"orderId":"o-1"}`),
	})
	fmt.Printf("%+v version=%d err=%v\n", s, version, err)
	// Output:
	// order order/o-1
	// {Customer:Ada Cents:1200 Cancelled:true} version=2 err=<nil>
}

func ExampleEvolve() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	placed := framework.DefineEvent[shopPlaced](shop, "placed", nil)

	total := framework.NewAggregate[int64]("order")
	framework.Evolve(total, placed, func(s *int64, e framework.Event[shopPlaced]) { *s += e.Payload.Cents })

	// Events without a fold are skipped but still advance the version; a
	// payload that does not decode stops the fold.
	s, version, err := total.Fold([]framework.Envelope{
		envelope("shop:event:placed", 1, `{"orderId":"o-1","customer":"Ada","cents":1200}`),
		envelope("shop:event:noted", 2, `{"text":"gift wrap"}`),
		envelope("shop:event:placed", 3, `{"orderId":"o-1","customer":"Ada","cents":300}`),
	})
	fmt.Println(s, version, err)
	_, version, err = total.Fold([]framework.Envelope{
		envelope("shop:event:placed", 1, `{"orderId":"o-1","customer":"Ada","cents":1}`),
		envelope("shop:event:placed", 2, `{"cents":"many"}`),
	})
	fmt.Println(version, err != nil)
	// Output:
	// 1500 3 <nil>
	// 1 true
}

func ExampleRegistry_Build() {
	r := framework.NewRegistry()
	shop := r.Feature("shop")
	framework.DefineEvent[shopPlaced](shop, "placed", nil)
	framework.DefineEvent[shopPlaced](shop, "placed", nil)
	framework.Write(shop, "placeOrder", func(context.Context, *framework.Tx, shopPlaceInput) (string, error) { return "", nil }, nil)
	framework.Write[shopPlaceInput, string](shop, "noop", nil, nil)
	framework.DefineEvent[shopCancelled](shop, "cancelled", &framework.EventOptions{Version: 2})

	// Every problem at once, one per line, and the runtime refuses to start.
	err := r.Build()
	fmt.Println(err)
	_, rtErr := framework.NewRuntime(r, nil, nil)
	fmt.Println(rtErr != nil)
	// Output:
	// kumiko: event shop:event:placed declared twice
	// kumiko: write name "placeOrder" of feature "shop" is not kebab-case
	// kumiko: write shop:write:noop has a nil handler
	// kumiko: event shop:event:cancelled: version 1 has no upcaster to 2
	// true
}
