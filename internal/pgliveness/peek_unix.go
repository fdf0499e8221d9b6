//go:build unix

package pgliveness

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// peek looks at c's socket with a non-blocking MSG_PEEK receive: nothing
// to read (EAGAIN) is a quiet connection; data, an end of stream or an
// error (a reset) is not. A TLS connection is looked at below its TLS
// layer: any record the server sent while the connection was idle counts.
func peek(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var rerr error
	var buf [1]byte
	if err := raw.Read(func(fd uintptr) bool {
		_, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // look once, never wait
	}); err != nil {
		return true // the descriptor is closed
	}
	// Nothing to read is quiet (an interrupted look, unknown, counts as
	// quiet too); a byte (n > 0), the end of stream (n == 0) or another
	// error (a reset) is not.
	return !errors.Is(rerr, syscall.EAGAIN) && !errors.Is(rerr, syscall.EWOULDBLOCK) && !errors.Is(rerr, syscall.EINTR)
}
