package entrypoint_test

import (
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// proxy forwards TCP connections to a target (Postgres) and can be switched
// into a black hole: connections are accepted and held, nothing is
// forwarded, as in a network partition. It lets a test make the database
// unreachable for one process without touching the shared server.
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// newProxy listens on a free loopback port and forwards to target.
func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.acceptLoop)
	t.Cleanup(p.close)
	return p
}

// Addr returns the proxy's address.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// setDown switches the black hole on (every open connection is frozen,
// new ones are held) or off (the frozen connections are closed, so their
// owners reconnect; new ones are forwarded).
func (p *proxy) setDown(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if !down {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

func (p *proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		down := p.down
		p.mu.Unlock()
		if down {
			continue // held until the proxy comes back or closes
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

// forward copies both ways until either side ends; while the proxy is down
// the copying stops (the data stays unread), which freezes the connection.
func (p *proxy) forward(c net.Conn) {
	defer p.drop(c)
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	defer p.drop(up)
	done := make(chan struct{}, 2)
	go func() { p.copy(up, c); done <- struct{}{} }()
	go func() { p.copy(c, up); done <- struct{}{} }()
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
}

// copy moves data from src to dst, chunk by chunk, as long as the proxy is
// up; when it goes down, the chunk in hand is dropped and copying waits for
// the connection to be closed.
func (p *proxy) copy(dst, src net.Conn) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			_, _ = io.Copy(io.Discard, src) // frozen: nothing reaches the other side
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) drop(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
