package framework_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
)

// regPayload is a payload for registry tests; its content does not matter.
type regPayload struct {
	Name string `json:"name" validate:"required"`
}

func regWrite(context.Context, *framework.Tx, regPayload) (struct{}, error) { return struct{}{}, nil }

func regQuery(context.Context, *framework.Tx, regPayload) (struct{}, error) { return struct{}{}, nil }

func regApply(context.Context, *framework.Tx, framework.Event[regPayload]) error { return nil }

func regUpcast(p json.RawMessage) (json.RawMessage, error) { return p, nil }

// joinedErrors splits the error returned by Build into its problems.
func joinedErrors(t *testing.T, err error) []error {
	t.Helper()
	require.Error(t, err)
	var multi interface{ Unwrap() []error }
	require.ErrorAs(t, err, &multi, "Build returns one joined error")
	return multi.Unwrap()
}

// Every registration mistake is collected and reported by one Build call,
// so a developer fixes them in one round instead of one per boot.
func TestBuildReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()

	// Handles from another registry: one of a name this registry never
	// declares, one of a name it declares too (a different definition).
	other := framework.NewRegistry()
	foreign := framework.DefineEvent[regPayload](other.Feature("elsewhere"), "thing", nil)
	sameNameForeign := framework.DefineEvent[regPayload](other.Feature("shop"), "placed", nil)
	require.NoError(t, other.Build())

	r := framework.NewRegistry()
	shop := r.Feature("shop")
	placed := framework.DefineEvent[regPayload](shop, "placed", nil)
	shipped := framework.DefineEvent[regPayload](shop, "shipped", nil)
	framework.DefineEvent[regPayload](shop, "placed", nil)
	framework.DefineEvent[regPayload](shop, "Bad_Event", nil)
	framework.DefineEvent[regPayload](shop, "evolved", &framework.EventOptions{Version: 3})
	framework.DefineEvent[regPayload](shop, "far-evolved", &framework.EventOptions{Version: framework.MaxEventVersion + 1})
	framework.DefineEvent[regPayload](shop, "negative", &framework.EventOptions{Version: -2})
	framework.DefineEvent[regPayload](shop, "half-evolved", &framework.EventOptions{
		Version: 3, Upcasters: map[int]framework.Upcaster{1: regUpcast},
	})
	// An upcaster added without bumping Version: the new shape would be
	// stored under the old version number and upcast again later.
	framework.DefineEvent[regPayload](shop, "unbumped", &framework.EventOptions{
		Version: 2, Upcasters: map[int]framework.Upcaster{1: regUpcast, 2: regUpcast, 0: regUpcast},
	})

	framework.Write(shop, "place", regWrite, nil)
	framework.Write(shop, "place", regWrite, nil)
	framework.Write(shop, "placeOrder", regWrite, nil)
	framework.Write[regPayload, struct{}](shop, "nil-write", nil, nil)

	framework.Query(shop, "get", regQuery, nil)
	framework.Query(shop, "get", regQuery, nil)
	framework.Query(shop, "get_all", regQuery, nil)
	framework.Query[regPayload, struct{}](shop, "nil-query", nil, nil)

	r.Feature("Shop")
	r.Feature("my shop")

	p := framework.InlineProjection(shop, "totals")
	framework.On(p, placed, regApply)
	framework.On(p, framework.EventType[regPayload]{}, regApply)
	framework.On(p, foreign, regApply)
	framework.On(p, sameNameForeign, regApply)
	framework.On(p, placed, regApply)
	framework.On[regPayload](p, shipped, nil)
	framework.InlineProjection(shop, "totals")
	framework.MultiStreamProjection(shop, "Audit", nil)
	framework.MultiStreamProjection(shop, "audit", &framework.ProjectionOptions{Delivery: "sometimes", RunIn: "nowhere", BatchSize: -1, MaxAttempts: -3})

	want := []string{
		`kumiko: event shop:event:placed declared twice`,
		`kumiko: event name "Bad_Event" of feature "shop" is not kebab-case`,
		`kumiko: event shop:event:evolved: version 1 has no upcaster to 2`,
		`kumiko: event shop:event:evolved: version 2 has no upcaster to 3`,
		`kumiko: event shop:event:far-evolved: version 2147483648 is above the largest, 2147483647`,
		`kumiko: event shop:event:half-evolved: version 2 has no upcaster to 3`,
		`kumiko: event shop:event:negative: version -2: versions start at 1 (0 means 1)`,
		`kumiko: event shop:event:unbumped: upcaster from version 0: versions start at 1`,
		`kumiko: event shop:event:unbumped: upcaster from version 2, but the current version is 2 (bump Version to 3)`,
		`kumiko: write shop:write:place registered twice`,
		`kumiko: write name "placeOrder" of feature "shop" is not kebab-case`,
		`kumiko: write shop:write:nil-write has a nil handler`,
		`kumiko: query shop:query:get registered twice`,
		`kumiko: query name "get_all" of feature "shop" is not kebab-case`,
		`kumiko: query shop:query:nil-query has a nil handler`,
		`kumiko: feature name "Shop" is not kebab-case`,
		`kumiko: feature name "my shop" is not kebab-case`,
		`kumiko: projection shop:totals handles undeclared event ""`,
		`kumiko: projection shop:totals handles undeclared event "elsewhere:event:thing"`,
		`kumiko: projection shop:totals handles undeclared event "shop:event:placed"`,
		`kumiko: projection shop:totals handles shop:event:placed twice`,
		`kumiko: projection shop:totals: nil handler for shop:event:shipped`,
		`kumiko: projection shop:totals registered twice`,
		`kumiko: projection name "Audit" of feature "shop" is not kebab-case`,
		`kumiko: projection shop:audit: delivery "sometimes" is not shared or per-instance`,
		`kumiko: projection shop:audit: runIn "nowhere" is not api, worker or both`,
		`kumiko: projection shop:audit: batch size -1 is negative`,
		`kumiko: projection shop:audit: max attempts -3 is negative`,
		`kumiko: projection shop:Audit handles no event: add its handlers with framework.On`,
		`kumiko: projection shop:audit handles no event: add its handlers with framework.On`,
	}

	err := r.Build()
	problems := joinedErrors(t, err)
	msg := err.Error()
	for _, w := range want {
		require.Contains(t, msg, w)
	}
	got := make([]string, len(problems))
	for i, p := range problems {
		got[i] = p.Error()
	}
	require.ElementsMatch(t, want, got, "each problem is reported exactly once")

	// Build is repeatable, and NewRuntime refuses the registry with the
	// same error before it touches the (here absent) pool.
	require.EqualError(t, r.Build(), msg)
	rt, err := framework.NewRuntime(r, nil, nil)
	require.Nil(t, rt)
	require.EqualError(t, err, msg)
}

// The problems are listed in registration order, one per line, so the
// boot log reads top to bottom like the feature's code.
func TestBuildListsProblemsInRegistrationOrder(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	f := r.Feature("shop")
	framework.Write(f, "Place", regWrite, nil)
	framework.DefineEvent[regPayload](f, "placed", nil)
	framework.DefineEvent[regPayload](f, "placed", nil)
	framework.Query[regPayload, struct{}](f, "get", nil, nil)

	err := r.Build()
	require.Len(t, joinedErrors(t, err), 3)
	require.Equal(t, strings.Join([]string{
		`kumiko: write name "Place" of feature "shop" is not kebab-case`,
		`kumiko: event shop:event:placed declared twice`,
		`kumiko: query shop:query:get has a nil handler`,
	}, "\n"), err.Error())
}

// The kebab-case rule, name by name: the same pattern guards feature,
// event, write, query and projection names.
func TestNamesMustBeKebabCase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"orders", true},
		{"place-order", true},
		{"v2", true},
		{"step-2-of-3", true},
		{"", false},
		{"Orders", false},
		{"place_order", false},
		{"placeOrder", false},
		{"-place", false},
		{"place-", false},
		{"place--order", false},
		{"2fast", false},
		{"place order", false},
		{"orders:place", false},
	} {
		r := framework.NewRegistry()
		f := r.Feature("kebab")
		framework.DefineEvent[regPayload](f, tc.name, nil)
		framework.Write(f, tc.name, regWrite, nil)
		framework.Query(f, tc.name, regQuery, nil)
		placed := framework.DefineEvent[regPayload](f, "placed", nil)
		framework.On(framework.MultiStreamProjection(f, tc.name, nil), placed, regApply)
		r.Feature(tc.name)
		err := r.Build()
		if tc.ok {
			require.NoError(t, err, "%q", tc.name)
			continue
		}
		require.Len(t, joinedErrors(t, err), 5, "%q: one problem per kind", tc.name)
		for _, kind := range []string{"event", "write", "query", "projection", "feature"} {
			require.Contains(t, err.Error(), kind+` name "`+tc.name+`"`, "%q", tc.name)
		}
	}
}

// A correct registry (the orders sample plus every kind of registration)
// builds without error and lists what it holds.
func TestCleanRegistryBuilds(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	o := orders.Register(r)
	f := r.Feature("audit")
	require.Same(t, f, r.Feature("audit"), "Feature returns the same feature on every call")
	renamed := framework.DefineEvent[regPayload](f, "renamed", &framework.EventOptions{
		Version: 3, Upcasters: map[int]framework.Upcaster{1: regUpcast, 2: regUpcast},
	})
	framework.DefineEvent[regPayload](f, "ping", &framework.EventOptions{PubSub: true})
	inline := framework.InlineProjection(f, "order-log")
	framework.On(inline, o.Placed, func(context.Context, *framework.Tx, framework.Event[orders.Placed]) error { return nil })
	framework.On(inline, o.Cancelled, func(context.Context, *framework.Tx, framework.Event[orders.Cancelled]) error { return nil })
	ms := framework.MultiStreamProjection(f, "trail", &framework.ProjectionOptions{Table: "audit_trail", Delivery: framework.DeliveryPerInstance, RunIn: framework.RunInBoth})
	framework.On(ms, renamed, regApply)
	framework.Write(f, "note", regWrite, &framework.WriteOptions[regPayload, struct{}]{Roles: []string{"admin"}})
	framework.Query(f, "trail", regQuery, &framework.QueryOptions{Roles: []string{"auditor"}})

	require.NoError(t, r.Build())
	// The orders sample grows over time; check what this test registered
	// and the parts of orders it relies on, and that every list is sorted.
	require.Subset(t, r.EventTypes(), []string{"audit:event:ping", "audit:event:renamed", "orders:event:cancelled", "orders:event:placed"})
	require.Subset(t, r.WriteTypes(), []string{"audit:write:note", "orders:write:cancel", "orders:write:place"})
	require.Subset(t, r.QueryTypes(), []string{"audit:query:trail", "orders:query:get", "orders:query:list"})
	for _, list := range [][]string{r.EventTypes(), r.WriteTypes(), r.QueryTypes()} {
		require.True(t, slices.IsSorted(list), "%v", list)
	}
	require.True(t, r.HasEvent("orders:event:placed"))
	require.False(t, r.HasEvent("orders:event:shipped"))
	require.True(t, r.IsPubSub("audit:event:ping"))
	require.False(t, r.IsPubSub("audit:event:renamed"))
	require.Equal(t, 3, renamed.Version())

	names := make([]string, 0, len(r.Projections()))
	for _, p := range r.Projections() {
		names = append(names, p.Name())
	}
	require.True(t, slices.IsSorted(names), "%v", names)
	require.Subset(t, names, []string{"audit:order-log", "audit:trail"})
	require.Same(t, inline, r.Projection("audit:order-log"))
	require.Equal(t, framework.KindInline, inline.Kind())
	require.Equal(t, []string{"orders:event:placed", "orders:event:cancelled"}, inline.EventTypes())
	require.Equal(t, framework.KindMultiStream, ms.Kind())
	require.Same(t, ms, r.Projection("audit:trail"))
	require.Nil(t, r.Projection("audit:nope"))
	opts := ms.Options()
	require.Equal(t, framework.DeliveryPerInstance, opts.Delivery)
	require.Equal(t, framework.RunInBoth, opts.RunIn)
	require.Equal(t, 10, opts.MaxAttempts)
	require.Equal(t, "audit_trail", opts.Table)

	rt, err := framework.NewRuntime(r, nil, nil)
	require.NoError(t, err)
	require.Same(t, r, rt.Registry())
}

// An empty registry is valid: an application may boot with no features.
func TestEmptyRegistryBuilds(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	require.NoError(t, r.Build())
	require.Empty(t, r.EventTypes())
	require.Empty(t, r.Projections())
}

// A zero or foreign handle makes no sense to [framework.Evolve] either;
// it refuses at declaration time, before any stream is folded.
func TestEvolveRejectsZeroEventType(t *testing.T) {
	t.Parallel()
	agg := framework.NewAggregate[struct{}]("thing")
	require.PanicsWithValue(t, "kumiko: Evolve with an undeclared event type", func() {
		framework.Evolve(agg, framework.EventType[regPayload]{}, func(*struct{}, framework.Event[regPayload]) {})
	})
}

// A second fold for one event type would silently replace the first (a
// copied Evolve line whose type was not changed loses a fold and leaves
// the intended type without one), and a nil fold would panic on the first
// Load; Evolve refuses both at declaration time, as On refuses a second or
// nil handler of a projection.
func TestEvolveRejectsSecondAndNilFold(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	ev := framework.DefineEvent[regPayload](r.Feature("reg"), "thing-made", nil)
	agg := framework.NewAggregate[int]("thing")
	framework.Evolve(agg, ev, func(s *int, _ framework.Event[regPayload]) { *s++ })
	require.PanicsWithValue(t, "kumiko: Evolve of aggregate thing: a second fold for reg:event:thing-made", func() {
		framework.Evolve(agg, ev, func(s *int, _ framework.Event[regPayload]) { *s-- })
	})
	// The same name declared in another registry: an aggregate kept in a
	// package variable and registered once per registry (as tests do).
	r2 := framework.NewRegistry()
	ev2 := framework.DefineEvent[regPayload](r2.Feature("reg"), "thing-made", nil)
	framework.Evolve(agg, ev2, func(s *int, _ framework.Event[regPayload]) { *s += 2 })
	require.PanicsWithValue(t, "kumiko: Evolve of aggregate thing: nil fold for reg:event:thing-made", func() {
		framework.Evolve(framework.NewAggregate[int]("thing"), ev, nil)
	})
}

// errors.Join must not hide the problems' type: each one is a plain error
// whose text starts with "kumiko: ".
func TestBuildProblemsArePrefixed(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	framework.DefineEvent[regPayload](r.Feature("BAD"), "ALSO_BAD", nil)
	for _, p := range joinedErrors(t, r.Build()) {
		require.True(t, strings.HasPrefix(p.Error(), "kumiko: "), p.Error())
		require.False(t, errors.Is(p, framework.ErrNotFound))
	}
}

// "After Build the registry is read-only": a registration after Build can
// no longer be reported by Build, and would race with the runtime's
// lock-free reads (an inline projection added then would silently never
// run), so it must fail loudly.
func TestRegistrationAfterBuildPanics(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	f := r.Feature("shop")
	placed := framework.DefineEvent[regPayload](f, "placed", nil)
	p := framework.InlineProjection(f, "totals")
	require.NoError(t, r.Build())

	const msg = "kumiko: registration after Registry.Build"
	require.PanicsWithValue(t, msg, func() { r.Feature("late") })
	require.PanicsWithValue(t, msg, func() { framework.DefineEvent[regPayload](f, "late", nil) })
	require.PanicsWithValue(t, msg, func() { framework.Write(f, "late", regWrite, nil) })
	require.PanicsWithValue(t, msg, func() { framework.Query(f, "late", regQuery, nil) })
	require.PanicsWithValue(t, msg, func() { framework.InlineProjection(f, "late") })
	require.PanicsWithValue(t, msg, func() { framework.MultiStreamProjection(f, "late", nil) })
	require.PanicsWithValue(t, msg, func() { framework.On(p, placed, regApply) })
	require.NoError(t, r.Build(), "Build stays callable")
}

// TestPerInstanceSagaIsRefused: a saga appends events, and a per-instance
// projection runs in every process with a cursor of its own, so a
// per-instance saga appended each of its events once per running process.
func TestPerInstanceSagaIsRefused(t *testing.T) {
	r := framework.NewRegistry()
	f := r.Feature("shop")
	placed := framework.DefineEvent[regPayload](f, "placed", nil)
	framework.On(framework.MultiStreamProjection(f, "shipping", &framework.ProjectionOptions{Saga: true, Delivery: framework.DeliveryPerInstance}), placed, regApply)
	framework.On(framework.MultiStreamProjection(f, "billing", &framework.ProjectionOptions{Saga: true}), placed, regApply)
	require.EqualError(t, r.Build(), "kumiko: projection shop:shipping: a saga cannot have per-instance delivery: every process would append its events once")
}

// A multi-stream projection without handlers (its framework.On calls
// forgotten) would read every event type: its cursor would pin retention
// of every type and show lag over the whole log while it applies nothing.
// The boot refuses it, naming the projection.
func TestProjectionWithoutHandlersIsRefused(t *testing.T) {
	t.Parallel()
	r := framework.NewRegistry()
	f := r.Feature("shop")
	placed := framework.DefineEvent[regPayload](f, "placed", nil)
	framework.On(framework.MultiStreamProjection(f, "totals", nil), placed, regApply)
	framework.MultiStreamProjection(f, "audit", nil)
	require.EqualError(t, r.Build(), "kumiko: projection shop:audit handles no event: add its handlers with framework.On")
}
