package sse_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/framework/web"
)

// TestStreamEndsWhenTokenExpires: a stream lives no longer than the token
// that opened it (its exp plus the verifier's 30 s of leeway); the client
// reconnects with a fresh token, or gets 401.
func TestStreamEndsWhenTokenExpires(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	// Past its exp, but within the leeway for about six more seconds (room
	// for the event on a loaded machine).
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "u1", "tenantId": "acme",
		"iat": time.Now().Add(-time.Hour).Unix(), "exp": time.Now().Add(-24 * time.Second).Unix()})
	tok.Header["kid"] = "k1"
	signed, err := tok.SignedString([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)

	c := b.connect(t, request{token: signed})
	b.note(t, "acme", "memo", 1, "while valid")
	c.waitFor(t, 1)
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the stream outlived its token")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	require.ErrorIs(t, c.err, io.EOF, "the stream ends normally")
}

// TestReplayEndsWhenTokenExpires: the token bounds a resumed stream's
// replay too, not only its live part: a slow client resuming a long
// backlog with a token about to expire does not read on past it.
func TestReplayEndsWhenTokenExpires(t *testing.T) {
	t.Parallel()
	const n = 200
	b := setup(t, &sse.Config{ReplayBatch: 5, WriteTimeout: time.Minute})
	big := strings.Repeat("x", 40<<10)
	for i := range n {
		b.note(t, "acme", "memo", i, big)
	}
	log := b.logOf(t, "acme")
	last, err := sse.ParseEventID(log[n-1])
	require.NoError(t, err)
	eventually(t, "hub past the backlog", func() bool { return !b.hub.Position().Less(last) })
	// Within the 30 s leeway for about three more seconds.
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "u1", "tenantId": "acme",
		"iat": time.Now().Add(-time.Hour).Unix(), "exp": time.Now().Add(-27 * time.Second).Unix()})
	tok.Header["kid"] = "k1"
	signed, err := tok.SignedString([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)

	// A slow reader: 4 KB every 10 ms, about 20 s for the 8 MB backlog,
	// behind a small receive buffer.
	conn := b.dialResume(t, signed, log[0])
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(start.Add(wait)))
	resp, err := http.ReadResponse(bufio.NewReader(readerFunc(func(p []byte) (int, error) {
		time.Sleep(10 * time.Millisecond)
		return conn.Read(p[:min(len(p), 4096)])
	})), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	rd := sse.NewReader(resp.Body)
	requireOpen(t, rd)
	var got int
	for {
		if _, err = rd.Next(); err != nil {
			break
		}
		got++
	}
	require.ErrorIs(t, err, io.EOF, "the stream ends normally")
	require.Less(t, got, n-1, "the replay ran to its end")
	require.Less(t, time.Since(start), 12*time.Second, "the replay outlived its token by far")
}

// TestReplayWaitingForAReadEndsAtTokenExpiry: a replay checks its token
// between pages, but its wait for a page (its turn among
// Config.ReplayConns, or a read a lock holds up) may last for long: the
// wait ends when the token expires, and the stream with it, instead of
// sending the page the read brings once it is let through. Here the first
// page's read is held (a lock) from before the token expires until after.
func TestReplayWaitingForAReadEndsAtTokenExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{ReplayBatch: 2})
	log := b.memoBacklog(t, "acme", 5)
	var armed atomic.Bool
	armed.Store(true)
	held, open := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s := web.New(b.rt, b.keys, nil)
	b.hub.Mount(s)
	h := s.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(gatedWriter{ResponseWriter: w, armed: &armed, held: held, open: open, once: &once}, r)
	}))
	t.Cleanup(srv.Close)

	// Past its exp, within the 30 s leeway for about eight more seconds.
	exp := time.Now().Add(-22 * time.Second).Unix()
	expires := time.Unix(exp, 0).Add(30 * time.Second)
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "u1", "tenantId": "acme",
		"iat": time.Now().Add(-time.Hour).Unix(), "exp": exp})
	tok.Header["kid"] = "k1"
	signed, err := tok.SignedString([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+sse.Path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+signed)
	req.Header.Set(sse.HeaderLastEventID, log[0])
	type answer struct {
		resp *http.Response
		err  error
	}
	answers := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		answers <- answer{resp, err}
	}()

	// The id is checked, the opening frame waits at the gate: hold the
	// replay's first page read, then let the opening frame out.
	select {
	case <-held:
	case <-time.After(wait):
		t.Fatal("the stream never opened")
	}
	release := b.holdReplayReads(t)
	defer release()
	armed.Store(false)
	close(open)
	a := <-answers
	require.NoError(t, a.err)
	defer a.resp.Body.Close()
	require.Equal(t, http.StatusOK, a.resp.StatusCode)
	rd := sse.NewReader(a.resp.Body)
	requireOpen(t, rd)
	eventually(t, "the replay's first page waits for the lock", func() bool { return b.replayReadsWaiting(t) > 0 })
	require.True(t, time.Now().Before(expires), "the page's read must wait from before the token's expiry")

	time.Sleep(time.Until(expires) + 500*time.Millisecond)
	release()
	ev, err := rd.Next()
	require.ErrorIs(t, err, io.EOF, "the stream sent %s (%s) after its token expired", ev.ID, ev.Type)
}
