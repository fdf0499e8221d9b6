//go:build !unix

package pgliveness

import "net"

// peek cannot look without MSG_PEEK: the pool's idle ping stays the only
// check.
func peek(net.Conn) bool { return false }
