package sse_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/retention"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// Ping is the payload of the pub/sub type sse-test:event:ping.
type Ping struct {
	N int `json:"n"`
}

// TestResumeAcrossPrune: a client whose last event survived a prune, but
// which had not received events after it that the prune deleted, must not
// resume as if nothing were missing: the replay would skip the pruned
// events silently. It gets the same 400 as a client whose last event was
// pruned, and starts afresh. A client past the pruned events, and one whose
// filter excludes the pruned type, resume as before.
func TestResumeAcrossPrune(t *testing.T) {
	t.Parallel()
	var ping framework.EventType[Ping]
	b := setupWith(t, nil, func(reg *framework.Registry) {
		ping = framework.DefineEvent[Ping](reg.Feature("sse-pub"), "ping", &framework.EventOptions{PubSub: true})
	})
	ctx := context.Background()
	pinged := func(tenant string, n int) {
		_, err := b.rt.InTx(ctx, tenant, framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "ping", ID: uuid.NewString()}, framework.NoStream, ping.With(Ping{N: n}))
		})
		require.NoError(t, err)
	}
	live := b.connect(t, request{tenant: "acme"})
	b.note(t, "acme", "memo", 1, "") // the resuming client's last event
	pinged("acme", 2)
	pinged("acme", 3)
	b.note(t, "acme", "memo", 4, "")
	pinged("other", 5) // another tenant's prune concerns no acme client
	got := live.waitFor(t, 4)
	// The hub's consumer has passed them (the client got them live).
	_, err := b.db.Pool.Exec(ctx, `UPDATE events SET created_at = now() - interval '40 days' WHERE type = 'sse-pub:event:ping'`)
	require.NoError(t, err)
	b.db.WaitVisible(t)
	var res *retention.Result
	require.Eventually(t, func() bool {
		res, err = retention.Prune(ctx, b.db.Pool, b.reg, &retention.Options{OlderThanDays: 30})
		return err == nil
	}, wait, 20*time.Millisecond)
	require.Equal(t, int64(3), res.Total, fmt.Sprint(res.Counts))

	code, body := b.status(t, request{tenant: "acme", lastID: got[0].ID})
	require.Equal(t, http.StatusBadRequest, code, "resuming across pruned events it never got")
	require.Contains(t, body, `"code":"bad_request"`)

	// Past the pruned events: resumes.
	after := b.connect(t, request{tenant: "acme", lastID: got[3].ID})
	// Not reading the pruned type: resumes and gets the rest of its types.
	memos := b.connect(t, request{tenant: "acme", query: "types=sse-test:event:noted", lastID: got[0].ID})
	require.Equal(t, got[3].ID, memos.waitFor(t, 1)[0].ID)
	b.note(t, "acme", "memo", 6, "")
	// (Tenant other's ping after it was pruned too: another tenant's prune
	// refuses no acme client.)
	require.Len(t, after.waitFor(t, 1), 1)
}

// TestPruneDuringReplayEndsTheStream: a prune that commits while a
// resumed client's replay is under way deletes events the replay has not
// read yet. The replay must not skip them silently (and then go live, as if
// nothing were missing): it ends the stream, and the client's resume from
// its last event is the 400 of a cursor across pruned events.
func TestPruneDuringReplayEndsTheStream(t *testing.T) {
	t.Parallel()
	const n = 200
	var ping framework.EventType[Ping]
	b := setupWith(t, &sse.Config{ReplayBatch: 5, WriteTimeout: time.Minute}, func(reg *framework.Registry) {
		ping = framework.DefineEvent[Ping](reg.Feature("sse-pub"), "ping", &framework.EventOptions{PubSub: true})
	})
	ctx := context.Background()
	big := strings.Repeat("x", 40<<10)
	b.note(t, "acme", "memo", 0, "") // the resuming client's last event
	for i := range n {
		_, err := b.rt.InTx(ctx, "acme", framework.Metadata{}, func(_ context.Context, tx *framework.Tx) error {
			return tx.Append(framework.Stream{Type: "ping", ID: uuid.NewString()}, framework.NoStream, ping.With(Ping{N: i}))
		})
		require.NoError(t, err)
		b.note(t, "acme", "memo", i+1, big) // keeps the pages large
	}
	log := b.logOf(t, "acme")
	last, err := sse.ParseEventID(log[len(log)-1])
	require.NoError(t, err)
	eventually(t, "hub past the backlog", func() bool { return !b.hub.Position().Less(last) })

	// A client with a small receive buffer: its replay blocks in a write
	// long before the end of the 8 MB backlog.
	conn := b.dialResume(t, b.token(t, "acme"), log[0])
	eventually(t, "replay blocked in a write", func() bool { return sse.Writing(b.hub) == 1 })

	// Meanwhile the pings are pruned.
	_, err = b.db.Pool.Exec(ctx, `UPDATE events SET created_at = now() - interval '40 days' WHERE type = 'sse-pub:event:ping'`)
	require.NoError(t, err)
	b.db.WaitVisible(t)
	require.Eventually(t, func() bool {
		_, err = retention.Prune(ctx, b.db.Pool, b.reg, &retention.Options{OlderThanDays: 30})
		return err == nil
	}, wait, 20*time.Millisecond)

	// The client reads on: what it gets is an unbroken prefix of the log,
	// and where it ends short, resuming is refused.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	rd := sse.NewReader(resp.Body)
	requireOpen(t, rd)
	var got []string
	for len(got) < len(log)-1 {
		ev, err := rd.Next()
		if err != nil {
			break
		}
		got = append(got, ev.ID)
	}
	require.Equal(t, log[1:1+len(got)], got, "the replay skipped pruned events")
	require.Less(t, len(got), len(log)-1, "the prune came after the whole replay: the test proves nothing")
	// Refused: as a cursor across pruned events, or (when the last event
	// the client got was a ping) as one that names a pruned event.
	code, body := b.status(t, request{tenant: "acme", lastID: rd.LastID()})
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "reconnect without it")
}
