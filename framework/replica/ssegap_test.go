package replica_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/dispatcher"
	"github.com/kumiko-go/kumiko/framework/eventstore"
	"github.com/kumiko-go/kumiko/framework/replica"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/framework/web"
)

// TestFreshStreamLoadOnALaggingReplica: a client that opens the stream
// without an id and loads its state once it is open, as README says, must
// get every event either in the loaded state or live. The hub already has
// an order the standby has not replayed (replay paused): the stream does
// not send it (it is before the stream's start), and a load on the standby
// does not show it, so that client would miss it for good. The stream's
// opening frame carries a consistency token that covers everything before
// the stream's start: a load that sends it back waits for the standby, or
// runs on the primary, and shows the order.
func TestFreshStreamLoadOnALaggingReplica(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx := t.Context()
	primary := openPool(t, c.primary.URL("kumiko"))
	standby := openPool(t, c.standby.URL("kumiko"))

	reg := framework.NewRegistry()
	orders.Register(reg)
	require.NoError(t, reg.Build())
	router, err := replica.New(primary, standby, &replica.Config{WaitTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	rt, err := framework.NewRuntime(reg, primary, &framework.RuntimeConfig{ReadPool: standby, ReadRouter: router})
	require.NoError(t, err)
	hub, err := sse.New(primary, reg, nil)
	require.NoError(t, err)
	const inst = "gap-test"
	d, err := dispatcher.New(primary, reg, []dispatcher.Consumer{hub.Consumer()},
		&dispatcher.Config{InstanceID: inst, PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	rt.OnCommit(func(int) { d.Wake() })
	require.NoError(t, hub.Prime(ctx, inst))
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k", Secret: []byte("0123456789abcdef0123456789abcdef")}})
	require.NoError(t, err)
	s := web.New(rt, keys, nil)
	hub.Mount(s)
	srv := httptest.NewServer(s.Handler())
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_ = d.Run(runCtx)
	}()
	t.Cleanup(func() {
		hub.Close()
		srv.Close()
		stop()
		<-ran
	})
	tok, err := keys.Mint(auth.Principal{UserID: "alice", TenantID: "acme"}, time.Hour)
	require.NoError(t, err)

	post := func(path string, body any) []byte {
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(string(raw)))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		buf, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode, "%s", buf)
		return buf
	}
	place := func(customer string) string {
		var out struct{ Data orders.WriteResult }
		require.NoError(t, json.Unmarshal(post("/api/write", map[string]any{"type": "orders:write:place",
			"payload": map[string]any{"customer": customer, "amountCents": 1}}), &out))
		return out.Data.ID
	}
	// load is the client's state load: the tenant's orders, by customer.
	load := func(token string) []string {
		body := map[string]any{"type": "orders:query:list", "payload": map[string]any{"limit": 100}}
		if token != "" {
			body["consistencyToken"] = token
		}
		var out struct{ Data orders.ListResult }
		require.NoError(t, json.Unmarshal(post("/api/query", body), &out))
		var names []string
		for _, o := range out.Data.Items {
			names = append(names, o.Customer)
		}
		return names
	}

	standbyAdmin, err := pgx.Connect(ctx, c.standby.URL("kumiko"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = standbyAdmin.Close(context.Background()) })
	_, err = standbyAdmin.Exec(ctx, `SELECT pg_wal_replay_pause()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state string
		return standbyAdmin.QueryRow(ctx, `SELECT pg_get_wal_replay_pause_state()`).Scan(&state) == nil && state == "paused"
	}, 10*time.Second, 10*time.Millisecond)

	// Ada's order reaches the hub: for a stream opened now it is history.
	adaID := place("Ada")
	var ada eventstore.Cursor
	require.NoError(t, primary.QueryRow(ctx, `SELECT commit_key, position FROM events WHERE stream_id = $1`, adaID).
		Scan(&ada.CommitKey, &ada.Position))
	require.Eventually(t, func() bool { return !hub.Position().Less(ada) }, 30*time.Second, 5*time.Millisecond)

	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(sctx, http.MethodGet, srv.URL+sse.Path+"?types=orders:event:placed", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	// The stream is open: a later order is the stream's to send.
	place("Later")

	// The gap: loaded without a token, on the lagging standby, Ada is
	// missing, and the stream will not send her either.
	require.NotContains(t, load(""), "Ada", "the paused standby has not replayed Ada's order")

	rd := sse.NewReader(res.Body)
	first, err := rd.Next()
	require.NoError(t, err)
	require.Equal(t, "kumiko:open", first.Type, "the stream opens with a frame carrying a consistency token; got %s", first.Data)
	require.Empty(t, first.ID, "the opening frame sets no event id: it is no resume point")
	var open struct {
		ConsistencyToken string `json:"consistencyToken"`
	}
	require.NoError(t, json.Unmarshal(first.Data, &open))
	require.True(t, framework.ValidConsistencyToken(open.ConsistencyToken), "%q", open.ConsistencyToken)

	// The fix: loaded with the stream's token, Ada is there (from the
	// primary, the standby being paused), and the rest comes live.
	require.Contains(t, load(open.ConsistencyToken), "Ada", "the token covers every event the stream does not send")
	require.InDelta(t, 1, router.Fallbacks(replica.ReasonLag), 0, "the load waited for the standby, then ran on the primary")
	next, err := rd.Next()
	require.NoError(t, err)
	var d1 sse.Data
	require.NoError(t, json.Unmarshal(next.Data, &d1))
	require.Contains(t, string(d1.Payload), `"Later"`, "the first event frame is the later order, not Ada's")

	_, err = standbyAdmin.Exec(ctx, `SELECT pg_wal_replay_resume()`)
	require.NoError(t, err)
	// Once replayed, the token is served by the standby itself.
	require.Eventually(t, func() bool {
		var ok bool
		return standbyAdmin.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, open.ConsistencyToken).Scan(&ok) == nil && ok
	}, 30*time.Second, 10*time.Millisecond)
	require.Contains(t, load(open.ConsistencyToken), "Ada")
	require.InDelta(t, 1, router.Fallbacks(replica.ReasonLag), 0, "no second fallback")
}
