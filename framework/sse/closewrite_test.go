package sse_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/sse"
	"github.com/kumiko-go/kumiko/framework/web"
)

// gatedWriter holds the first write after armed until open is closed, as
// a network that stalls for a moment would; the connection's deadlines
// and flushes reach the real writer (Unwrap).
type gatedWriter struct {
	http.ResponseWriter
	armed *atomic.Bool
	held  chan struct{} // closed when a write waits at the gate
	open  chan struct{}
	once  *sync.Once
}

func (g gatedWriter) Write(p []byte) (int, error) {
	if g.armed.Load() {
		g.once.Do(func() { close(g.held) })
		<-g.open
	}
	return g.ResponseWriter.Write(p)
}

func (g gatedWriter) Unwrap() http.ResponseWriter { return g.ResponseWriter }

// TestCloseLetsAWriteInProgressFinish: a write under way when the hub
// closes (a drain) to a client that reads is let finish: the client gets
// the frame and a clean end of the stream, and resumes elsewhere from it,
// instead of a response cut mid-frame (an unexpected EOF, the frame lost
// to this connection). Only a write that does not finish within a moment
// is cut (see TestCloseDuringReplay).
func TestCloseLetsAWriteInProgressFinish(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{WriteTimeout: 5 * time.Second})
	var armed atomic.Bool
	held, open := make(chan struct{}), make(chan struct{})
	s := web.New(b.rt, b.keys, nil)
	b.hub.Mount(s)
	h := s.Handler()
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(gatedWriter{ResponseWriter: w, armed: &armed, held: held, open: open, once: &once}, r)
	}))
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+sse.Path, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+b.token(t, "acme"))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	rd := sse.NewReader(resp.Body)
	requireOpen(t, rd)

	armed.Store(true)
	b.note(t, "acme", "memo", 1, "in flight")
	select {
	case <-held:
	case <-time.After(wait):
		t.Fatal("the event's write never started")
	}
	closed := make(chan struct{})
	go func() { b.hub.Close(); close(closed) }()
	<-closed
	time.Sleep(20 * time.Millisecond) // the network recovers a moment later
	close(open)

	ev, err := rd.Next()
	require.NoError(t, err, "the frame under way at Close arrives whole")
	require.NotEmpty(t, ev.ID)
	_, err = rd.Next()
	require.ErrorIs(t, err, io.EOF, "the stream ends cleanly")
}
