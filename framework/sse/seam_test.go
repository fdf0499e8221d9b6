package sse_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/sse"
)

// logged is one event of a tenant's log as a stream sees it.
type logged struct {
	id, typ, streamType string
}

// typedLogOf returns tenant's events in delivery order with their types.
func (b *bundle) typedLogOf(t *testing.T, tenant string) []logged {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(),
		`SELECT commit_key::text || '-' || position, type, stream_type FROM events WHERE tenant_id = $1 ORDER BY commit_key, position`, tenant)
	require.NoError(t, err)
	defer rows.Close()
	var out []logged
	for rows.Next() {
		var l logged
		require.NoError(t, rows.Scan(&l.id, &l.typ, &l.streamType))
		out = append(out, l)
	}
	require.NoError(t, rows.Err())
	return out
}

// follower reads one tenant's stream from a resume point as a browser does:
// when the stream ends it reconnects with the last id it got, after a
// short pause, until stopped.
type follower struct {
	tenant, query, from string
	filter              sse.Filter

	mu         sync.Mutex
	got        []sse.Event
	reconnects int
	err        error
}

func (f *follower) run(ctx context.Context, t *testing.T, b *bundle) {
	last := f.from
	for ctx.Err() == nil {
		resp, err := http.DefaultClient.Do(b.newRequest(t, ctx, request{tenant: f.tenant, query: f.query, lastID: last}))
		if err != nil {
			if ctx.Err() == nil {
				f.fail(err)
			}
			return
		}
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			f.fail(fmt.Errorf("resume from %s answered %d: %s", last, resp.StatusCode, body))
			return
		}
		rd := sse.NewReader(resp.Body)
		if _, err := readOpen(rd); err != nil {
			resp.Body.Close()
			if ctx.Err() == nil {
				f.fail(err)
			}
			return
		}
		for {
			ev, err := rd.Next()
			if err != nil {
				break
			}
			f.mu.Lock()
			f.got = append(f.got, ev)
			f.mu.Unlock()
			last = ev.ID
		}
		resp.Body.Close()
		f.mu.Lock()
		f.reconnects++
		f.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (f *follower) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

// want returns the events of log after the follower's resume point that
// its filter passes.
func (f *follower) want(log []logged) []string {
	i := 0
	for i < len(log) && log[i].id != f.from {
		i++
	}
	var out []string
	for _, l := range log[i+1:] {
		if f.filter.Match(l.typ, l.streamType) {
			out = append(out, l.id)
		}
	}
	return out
}

// TestResumeWhileWritingSeesEachEventOnce: clients of two tenants resume
// from several points of their backlogs, with and without filters, while
// writers append to both tenants concurrently, in transactions of one to
// three events. Small buffers and replay pages make the resumes overflow
// during their replays and rejoin from the table, in rounds. Each client
// must see exactly its tenant's events after its resume point that its
// filter passes: each once, in the log's order, none of the other tenant
// (across the reconnects of a dropped client, as a browser makes them).
func TestResumeWhileWritingSeesEachEventOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{Buffer: 8, ReplayBatch: 3, WriteTimeout: 5 * time.Second})
	tenants := []string{"acme", "rival"}
	ctx := context.Background()
	// write appends n events to tenant in one transaction: memos, and an
	// order among them when withOrder.
	write := func(tenant string, n int, withOrder bool, tag int) error {
		_, err := b.rt.InTx(ctx, tenant, framework.Metadata{CorrelationID: fmt.Sprintf("w-%d", tag)},
			func(_ context.Context, tx *framework.Tx) error {
				for i := range n {
					if err := tx.Append(framework.Stream{Type: "memo", ID: uuid.NewString()}, framework.NoStream,
						b.noted.With(Noted{N: tag*10 + i, Text: tenant})); err != nil {
						return err
					}
				}
				return nil
			})
		if err == nil && withOrder {
			_, err = b.rt.Write(ctx, framework.Call{Principal: auth.Principal{UserID: "u", TenantID: tenant}, RequestID: uuid.NewString()},
				[]framework.Command{{Type: "orders:write:place", Payload: []byte(`{"customer":"C","amountCents":1}`)}})
		}
		return err
	}
	for i := range 40 {
		for _, tn := range tenants {
			require.NoError(t, write(tn, 1+i%3, i%4 == 0, i))
		}
	}
	backlog := map[string][]logged{}
	for _, tn := range tenants {
		backlog[tn] = b.typedLogOf(t, tn)
	}

	// Writers: both tenants, concurrently, until stopped.
	wctx, stopWriters := context.WithCancel(ctx)
	var writers sync.WaitGroup
	var werrMu sync.Mutex
	var werr error
	for w := range 3 {
		writers.Go(func() {
			for i := 0; wctx.Err() == nil; i++ {
				if err := write(tenants[(w+i)%2], 1+(w+i)%3, i%5 == 0, 1000*(w+1)+i); err != nil {
					werrMu.Lock()
					werr = errors.Join(werr, err)
					werrMu.Unlock()
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}

	placed := sse.Filter{Types: []string{"orders:event:placed"}}
	orderStreams := sse.Filter{StreamTypes: []string{"order"}}
	memos := sse.Filter{Types: []string{"sse-test:event:noted"}, StreamTypes: []string{"memo"}}
	var fs []*follower
	for _, tn := range tenants {
		log := backlog[tn]
		for _, at := range []int{0, len(log) / 3, len(log) - 1} {
			fs = append(fs,
				&follower{tenant: tn, from: log[at].id},
				&follower{tenant: tn, from: log[at].id, query: "types=orders:event:placed", filter: placed},
				&follower{tenant: tn, from: log[at].id, query: "streamTypes=order", filter: orderStreams},
				&follower{tenant: tn, from: log[at].id, query: "types=sse-test:event:noted&streamTypes=memo", filter: memos},
			)
		}
	}
	rctx, stopReaders := context.WithCancel(ctx)
	var readers sync.WaitGroup
	for i, f := range fs {
		readers.Go(func() {
			// Staggered: some resume before the writers got going, some
			// amid them.
			time.Sleep(time.Duration(i%6) * 50 * time.Millisecond)
			f.run(rctx, t, b)
		})
	}
	defer func() {
		stopReaders()
		readers.Wait()
	}()

	time.Sleep(1500 * time.Millisecond)
	stopWriters()
	writers.Wait()
	require.NoError(t, werr)
	logs := map[string][]logged{}
	for _, tn := range tenants {
		logs[tn] = b.typedLogOf(t, tn)
		t.Logf("%s: %d events, %d of them written during the resumes", tn, len(logs[tn]), len(logs[tn])-len(backlog[tn]))
	}

	for _, f := range fs {
		want := f.want(logs[f.tenant])
		deadline := time.Now().Add(wait)
		for {
			f.mu.Lock()
			n, err := len(f.got), f.err
			f.mu.Unlock()
			require.NoError(t, err)
			if n >= len(want) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Room for a duplicate or a foreign event to arrive late.
		time.Sleep(50 * time.Millisecond)
		f.mu.Lock()
		got := ids(f.got)
		f.mu.Unlock()
		require.Equal(t, want, got, "tenant %s from %s with %q (%d reconnects): each event once, in order, its tenant's only",
			f.tenant, f.from, f.query, f.reconnects)
	}
	t.Logf("dropped clients: %v", b.metric(t, "kumiko_sse_dropped_clients_total"))
}
