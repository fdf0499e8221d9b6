package sse_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/framework/web"
)

// TestOpeningFrameCoversTheEventsBeforeTheStream: every stream, fresh or
// resumed, opens with a frame (and a header) carrying a consistency token
// at or past the commit of each event the hub had when the stream started:
// a load that sends it back sees them on a lagging replica too (proved
// against a real one in framework/replica). A stream opened after the hub
// got a later event gets a later token, not an earlier stream's.
func TestOpeningFrameCoversTheEventsBeforeTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	// place writes an order, waits until the hub has its event, and
	// returns the write's token and the event's id.
	place := func(customer string) (token, id string) {
		_, token, err := b.rt.WriteWithToken(ctx, framework.Call{Principal: auth.Principal{UserID: "u", TenantID: "acme"}, RequestID: uuid.NewString()},
			[]framework.Command{{Type: "orders:write:place", Payload: []byte(fmt.Sprintf(`{"customer":%q,"amountCents":100}`, customer))}})
		require.NoError(t, err)
		log := b.logOf(t, "acme")
		id = log[len(log)-1]
		cur, err := sse.ParseEventID(id)
		require.NoError(t, err)
		eventually(t, "hub has "+customer, func() bool { return !b.hub.Position().Less(cur) })
		return token, id
	}
	atOrPast := func(a, b2 string) bool {
		var ok bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT $1::pg_lsn >= $2::pg_lsn`, a, b2).Scan(&ok))
		return ok
	}
	opened := func(c *client) sse.Open {
		eventually(t, "opening frame", func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.open.ConsistencyToken != "" || c.err != nil
		})
		c.mu.Lock()
		defer c.mu.Unlock()
		require.NoError(t, c.err)
		require.Equal(t, c.open.ConsistencyToken, c.resp.Header.Get(web.HeaderConsistencyToken), "the header carries the same token")
		return c.open
	}

	tok1, id1 := place("Ada")
	o1 := opened(b.connect(t, request{tenant: "acme"}))
	require.True(t, atOrPast(o1.ConsistencyToken, tok1), "token %s before the write's %s", o1.ConsistencyToken, tok1)

	tok2, _ := place("Grace")
	require.True(t, atOrPast(tok2, o1.ConsistencyToken))
	o2 := opened(b.connect(t, request{tenant: "acme"}))
	require.True(t, atOrPast(o2.ConsistencyToken, tok2), "a later stream gets a later token: %s before %s", o2.ConsistencyToken, tok2)

	resumed := b.connect(t, request{tenant: "acme", lastID: id1})
	o3 := opened(resumed)
	require.True(t, atOrPast(o3.ConsistencyToken, tok2))
	evs := resumed.waitFor(t, 1)
	require.Equal(t, "orders:event:placed", evs[0].Type, "the opening frame is not among the events")
}

// TestOpeningTokenNotCachedPastTheHub: a resume id ahead of the hub (here
// one forged by its tenant's client, from a guessable transaction id: the
// event is committed, but behind a transaction of another tenant that is
// still open) must not stand for what the hub has delivered. The stream
// of another tenant that opens once the hub got both events must get a
// token at or past the commit of the other tenant's event, not the one
// read for the forged resume before that commit: with it, the other
// tenant's load on a lagging replica misses an event its stream counts as
// before its start.
func TestOpeningTokenNotCachedPastTheHub(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()

	// Tenant rival's transaction takes its transaction id and appends, and
	// stays open: the horizon stays below it.
	appended, commit := make(chan struct{}), make(chan struct{})
	committed := make(chan error, 1)
	go func() {
		_, err := b.rt.InTx(ctx, "rival", framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
			if err := tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream, b.noted.With(Noted{N: 1})); err != nil {
				return err
			}
			if _, err := tx.Flush(ctx); err != nil {
				return err
			}
			close(appended)
			<-commit
			return nil
		})
		committed <- err
	}()
	<-appended
	// Tenant acme's event commits after it, with a later commit key.
	b.note(t, "acme", "memo", 2, "")
	forged := b.logOf(t, "acme")[0]
	forgedCur, err := sse.ParseEventID(forged)
	require.NoError(t, err)
	require.True(t, b.hub.Position().Less(forgedCur), "the hub cannot have acme's event before rival's commits")

	// acme's client resumes from that id: visible, so it is accepted.
	o := b.connect(t, request{tenant: "acme", lastID: forged})
	eventually(t, "acme's opening frame", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.open.ConsistencyToken != "" || o.err != nil
	})

	close(commit)
	require.NoError(t, <-committed)
	var afterCommit string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&afterCommit))
	eventually(t, "hub has both events", func() bool { return !b.hub.Position().Less(forgedCur) })

	// rival's fresh stream starts after its event: it will not send it.
	c := b.connect(t, request{tenant: "rival"})
	eventually(t, "rival's opening frame", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.open.ConsistencyToken != "" || c.err != nil
	})
	c.mu.Lock()
	tok, cerr := c.open.ConsistencyToken, c.err
	c.mu.Unlock()
	require.NoError(t, cerr)
	var covers bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT $1::pg_lsn >= $2::pg_lsn`, tok, afterCommit).Scan(&covers))
	require.True(t, covers, "rival's stream opened with %s, before the commit of rival's event (%s) it does not send", tok, afterCommit)
}

// TestOpeningTokenWaitIsBounded: the opening frame's token is read before
// the response starts (a request without one is a 503), so a stream
// waiting for it carries no heartbeat. When the pool has no connection
// free for that read (here the test holds them all: writes holding them
// behind a lock, a database that does not answer), the request must not
// stay silent until a proxy's idle timeout cuts it: after
// Config.ResumeWait it is answered 503, retry.
func TestOpeningTokenWaitIsBounded(t *testing.T) {
	t.Parallel()
	const (
		conns = 2
		bound = 300 * time.Millisecond
	)
	b := setupPool(t, &sse.Config{ResumeWait: bound}, nil, conns)
	actx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for range conns {
		c, err := b.pool.Acquire(actx)
		require.NoError(t, err)
		defer c.Release()
	}

	ctx, stop := context.WithTimeout(context.Background(), 20*bound)
	defer stop()
	began := time.Now()
	resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: "acme"}))
	require.NoError(t, err, "a stream waiting for its opening token was silent for %s", time.Since(began))
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.GreaterOrEqual(t, time.Since(began), bound)
}
