// Package pgliveness tells a pooled Postgres connection whose server side
// is gone from a healthy one before the pool hands it out, at the cost of
// one non-blocking system call.
//
// pgxpool pings a connection on acquire only after it was idle for more than
// a second. When the server ended its connections (a restart's shutdown, a
// crash, pg_terminate_backend), a connection idle for less was handed out,
// and the statements sent on it failed: a write whose batch ended in
// COMMIT then could not tell whether the server had run it, because a
// crashed server sends only a notice before closing. [ShouldPing] asks the
// kernel instead: an idle connection has nothing to read, so pending bytes
// (the server's notice or FATAL error) or an end of stream mean the server
// spoke or left, and the pool pings it, which fails and discards it.
package pgliveness

import (
	"context"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// idlePing is pgxpool's own threshold: a connection idle for longer is
// pinged anyway.
const idlePing = time.Second

// ShouldPing is a [pgxpool.Config].ShouldPing: it pings a connection idle
// for more than a second, as pgxpool does by default, and one that the
// server has written to or closed while it was idle (see [Spoke]).
func ShouldPing(ctx context.Context, p pgxpool.ShouldPingParams) bool {
	if p.IdleDuration > idlePing {
		return true
	}
	if p.Conn == nil {
		return false
	}
	// pgx may read the socket in the background during a slow write; the
	// socket is looked at directly only once that reader has stopped and
	// nothing is left in pgx's buffer (SyncConn pings otherwise: a failed
	// ping is a dead connection, which the pool's ping will find too).
	if err := p.Conn.PgConn().SyncConn(ctx); err != nil {
		return true
	}
	return Spoke(p.Conn.PgConn().Conn())
}

// Spoke reports whether an idle connection has bytes to read or has
// reached its end of stream: the peer wrote or closed while nobody asked.
// It reads nothing and does not wait for data; c must not be read by
// anyone else meanwhile (for a pgx connection, see PgConn.SyncConn), whose
// read it would wait for. It reports false where it cannot look
// (a connection without a file descriptor, a platform without MSG_PEEK).
func Spoke(c net.Conn) bool {
	return peek(c)
}
