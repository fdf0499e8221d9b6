package framework_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
)

// readsPlaced and readsGet are the payloads of the reads examples.
type readsPlaced struct {
	OrderID string `json:"orderId" validate:"required"`
}

type readsGet struct {
	OrderID string `json:"orderId" validate:"required"`
}

// ExampleCacheBy declares a cached single-entity read: the key names the
// entity a query input reads, and each InvalidatedBy names an event that
// changes it. The framework/cache consumer of those events drops the
// entity from the cache.
func ExampleCacheBy() {
	reg := framework.NewRegistry()
	f := reg.Feature("shop")
	renamed := framework.DefineEvent[readsPlaced](f, "renamed", nil)
	framework.Query(f, "get", func(ctx context.Context, tx *framework.Tx, in readsGet) (string, error) {
		return "order " + in.OrderID, nil
	}, &framework.QueryOptions{
		Cache: framework.CacheBy(time.Minute, func(in readsGet) string { return in.OrderID },
			framework.InvalidatedBy(renamed, func(e framework.Event[readsPlaced]) string { return e.Payload.OrderID })),
	})
	if err := reg.Build(); err != nil {
		fmt.Println(err)
		return
	}
	keys, _ := reg.CacheInvalidations(framework.Envelope{Type: "shop:event:renamed", Payload: json.RawMessage(`{"orderId":"o-1"}`)})
	fmt.Println(reg.CacheEventTypes(), keys[0].Query, keys[0].Key, keys[0].TTL)
	// Output: [shop:event:renamed] shop:query:get o-1 1m0s
}

var tokenPattern = regexp.MustCompile(`^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$`)

func FuzzValidConsistencyToken(f *testing.F) {
	for _, s := range []string{"0/0", "1/6D4ED0B8", "FFFFFFFF/FFFFFFFF", "", "/", "0/", "1/2/3", "123456789/0", "g/0", " 0/0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := framework.ValidConsistencyToken(s), tokenPattern.MatchString(s); got != want {
			t.Fatalf("ValidConsistencyToken(%q) = %v, want %v", s, got, want)
		}
	})
}

// TestWriteWithToken: the token is a WAL position PostgreSQL accepts, at
// or after the commit, and later writes get later tokens.
func TestWriteWithToken(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("tok")
	framework.Write(f, "touch", func(ctx context.Context, tx *framework.Tx, _ struct{}) (int, error) {
		_, err := tx.Exec(ctx, `SELECT 1`)
		return 1, err
	}, nil)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	call := framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}}
	cmds := []framework.Command{{Type: "tok:write:touch"}}
	_, t1, err := rt.WriteWithToken(t.Context(), call, cmds)
	require.NoError(t, err)
	out, t2, err := rt.WriteWithToken(t.Context(), call, cmds)
	require.NoError(t, err)
	require.Equal(t, []any{1}, out)
	require.True(t, framework.ValidConsistencyToken(t1), t1)
	var later, reached bool
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT $1::pg_lsn >= $2::pg_lsn, pg_current_wal_insert_lsn() >= $1::pg_lsn`, t2, t1).Scan(&later, &reached))
	require.True(t, later, "%s then %s", t1, t2)
	require.True(t, reached)
}

// TestAbortedCommitIsAnError: a handler that ignores a failed statement
// and returns success must not be reported as committed: PostgreSQL
// answers the COMMIT of the aborted transaction with ROLLBACK.
func TestAbortedCommitIsAnError(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("abort")
	noted := framework.DefineEvent[readsPlaced](f, "noted", nil)
	framework.Write(f, "swallow", func(ctx context.Context, tx *framework.Tx, _ struct{}) (string, error) {
		if err := tx.Append(framework.Stream{Type: "s", ID: "1"}, framework.AnyVersion, noted.With(readsPlaced{OrderID: "1"})); err != nil {
			return "", err
		}
		if _, err := tx.Flush(ctx); err != nil { // written now: the COMMIT batch holds nothing else
			return "", err
		}
		_, _ = tx.Exec(ctx, `SELECT 1/0`) // fails; the handler ignores it
		return "ok", nil
	}, nil)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	call := framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}}
	_, err = rt.Write(t.Context(), call, []framework.Command{{Type: "abort:write:swallow"}})
	require.Error(t, err)
	var n int
	require.NoError(t, db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM events`).Scan(&n))
	require.Zero(t, n)
}

// pinnedRouter sends every query to one pool and records the tokens.
type pinnedRouter struct {
	pool   *pgxpool.Pool
	tokens []string
	err    error
}

func (r *pinnedRouter) AcquireRead(ctx context.Context, token string) (*pgxpool.Conn, error) {
	r.tokens = append(r.tokens, token)
	if r.err != nil {
		return nil, r.err
	}
	return r.pool.Acquire(ctx)
}

// TestQueryRouting: queries ask the read router with the call's token; a
// malformed token is a bad request; a router failure is unavailable.
func TestQueryRouting(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	framework.Query(reg.Feature("route"), "ping", func(ctx context.Context, tx *framework.Tx, _ struct{}) (string, error) {
		return "pong", nil
	}, nil)
	router := &pinnedRouter{pool: db.Pool}
	rt, err := framework.NewRuntime(reg, db.Pool, &framework.RuntimeConfig{ReadRouter: router})
	require.NoError(t, err)
	call := framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}}
	cmd := framework.Command{Type: "route:query:ping"}
	out, err := rt.Query(t.Context(), call, cmd)
	require.NoError(t, err)
	require.Equal(t, "pong", out)
	call.ConsistencyToken = "0/16B3748"
	_, err = rt.Query(t.Context(), call, cmd)
	require.NoError(t, err)
	require.Equal(t, []string{"", "0/16B3748"}, router.tokens)

	call.ConsistencyToken = "0/16B3748; DROP TABLE"
	_, err = rt.Query(t.Context(), call, cmd)
	require.ErrorIs(t, err, &framework.Error{Code: framework.CodeBadRequest})
	require.Len(t, router.tokens, 2, "a malformed token reaches no database")

	router.err = errors.New("replica pool closed")
	call.ConsistencyToken = ""
	_, err = rt.Query(t.Context(), call, cmd)
	require.ErrorIs(t, err, &framework.Error{Code: framework.CodeUnavailable})
}

// TestBadQueryPayloadReachesNoDatabase: a payload that fails to decode or
// validate is the client's 400 before any connection is taken. It was
// decoded inside the query's transaction: a call with a consistency token
// first waited (up to the replica wait) for the replica and, on a lagging
// one, took a primary connection, only to answer validation_error.
func TestBadQueryPayloadReachesNoDatabase(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	framework.Query(reg.Feature("route"), "get", func(ctx context.Context, tx *framework.Tx, in readsGet) (string, error) {
		return in.OrderID, nil
	}, nil)
	router := &pinnedRouter{pool: db.Pool}
	rt, err := framework.NewRuntime(reg, db.Pool, &framework.RuntimeConfig{ReadRouter: router})
	require.NoError(t, err)
	call := framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}, ConsistencyToken: "0/16B3748"}
	for _, payload := range []string{`{}`, `{"orderId":1}`, `{"orderId":"o-1","extra":true}`, `[`} {
		_, err = rt.Query(t.Context(), call, framework.Command{Type: "route:query:get", Payload: json.RawMessage(payload)})
		var ve *framework.ValidationError
		require.ErrorAs(t, err, &ve, "payload %s", payload)
	}
	require.Empty(t, router.tokens, "no connection was asked for")
	out, err := rt.Query(t.Context(), call, framework.Command{Type: "route:query:get", Payload: json.RawMessage(`{"orderId":"o-1"}`)})
	require.NoError(t, err)
	require.Equal(t, "o-1", out)
	require.Equal(t, []string{"0/16B3748"}, router.tokens)
}

// TestQueryOfAnInterfaceInputWithoutPayload: a query whose input type is
// an interface (any: the handler reads whatever JSON it is sent) gets the
// nil interface for an absent or null payload, as it did before the
// payload was decoded ahead of the connection; the decoded input passed
// through an any and a type assertion to In, which panics on a nil
// interface, so such a query panicked for every call without a payload.
func TestQueryOfAnInterfaceInputWithoutPayload(t *testing.T) {
	t.Parallel()
	db := kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	f := reg.Feature("loose")
	framework.Query(f, "echo", func(ctx context.Context, tx *framework.Tx, in any) (string, error) {
		return fmt.Sprint(in), nil
	}, nil)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	call := framework.Call{Principal: framework.Principal{UserID: "u", TenantID: "acme"}}
	for _, typ := range []string{"loose:query:echo"} {
		for _, payload := range []string{``, `null`} {
			var out any
			require.NotPanics(t, func() {
				out, err = rt.Query(t.Context(), call, framework.Command{Type: typ, Payload: json.RawMessage(payload)})
			}, "%s with payload %q", typ, payload)
			require.NoError(t, err)
			require.Equal(t, "<nil>", out)
		}
		out, err := rt.Query(t.Context(), call, framework.Command{Type: typ, Payload: json.RawMessage(`{"a":1}`)})
		require.NoError(t, err)
		require.Equal(t, "map[a:1]", out)
	}
}
