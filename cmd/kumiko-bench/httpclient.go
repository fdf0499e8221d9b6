package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"strconv"
	"time"
)

// loadClient generates HTTP load as a tool such as wrk does: one keep-alive
// HTTP/1.1 connection per worker, each request written from a reused
// buffer, each response's status line, headers and body read straight off
// the connection. Go's http.Client hands every request to two goroutines
// per connection and back; on a machine whose two cores the clients share
// with the server and Postgres, that cost about 29 µs of CPU per request,
// which was charged to whatever the benchmark measured.
type loadClient struct {
	addr  string
	conns []*loadConn
}

// loadConn is one worker's connection (nil until first used or after an
// error).
type loadConn struct {
	c   net.Conn
	br  *bufio.Reader
	req []byte
}

// loadTimeout bounds one request's exchange.
const loadTimeout = 30 * time.Second

// newLoadClient returns a client of workers connections to addr
// ("host:port"); worker w must only be used by one goroutine at a time.
func newLoadClient(addr string, workers int) *loadClient {
	lc := &loadClient{addr: addr, conns: make([]*loadConn, workers)}
	for w := range lc.conns {
		lc.conns[w] = &loadConn{}
	}
	return lc
}

// header is one request header.
type header struct{ name, value string }

// post sends a POST of body to path on worker w's connection and returns
// the response's status and body.
func (lc *loadClient) post(ctx context.Context, w int, path string, body []byte, headers ...header) (int, []byte, error) {
	c := lc.conns[w]
	if c.c == nil {
		conn, err := (&net.Dialer{Timeout: loadTimeout}).DialContext(ctx, "tcp", lc.addr)
		if err != nil {
			return 0, nil, err
		}
		c.c, c.br = conn, bufio.NewReaderSize(conn, 16<<10)
	}
	r := append(c.req[:0], "POST "...)
	r = append(r, path...)
	r = append(r, " HTTP/1.1\r\nHost: "...)
	r = append(r, lc.addr...)
	r = append(r, "\r\nContent-Type: application/json\r\nContent-Length: "...)
	r = strconv.AppendInt(r, int64(len(body)), 10)
	for _, h := range headers {
		r = append(r, "\r\n"...)
		r = append(r, h.name...)
		r = append(r, ": "...)
		r = append(r, h.value...)
	}
	r = append(r, "\r\n\r\n"...)
	r = append(r, body...)
	c.req = r
	status, resp, err := c.exchange(r)
	if err != nil {
		_ = c.c.Close()
		c.c = nil
		return 0, nil, fmt.Errorf("POST %s: %w", path, err)
	}
	return status, resp, nil
}

// exchange writes req and reads one response.
func (c *loadConn) exchange(req []byte) (int, []byte, error) {
	if err := c.c.SetDeadline(time.Now().Add(loadTimeout)); err != nil {
		return 0, nil, err
	}
	if _, err := c.c.Write(req); err != nil {
		return 0, nil, err
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, nil, fmt.Errorf("malformed status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("malformed status line %q", line)
	}
	length, chunked := -1, false
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return 0, nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, nil, fmt.Errorf("malformed header %q", line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
				return 0, nil, fmt.Errorf("malformed Content-Length %q", value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		}
	}
	switch {
	case chunked:
		body, err := io.ReadAll(httputil.NewChunkedReader(c.br))
		if err != nil {
			return 0, nil, err
		}
		// The trailer section ends with an empty line.
		for {
			line, err := c.br.ReadSlice('\n')
			if err != nil {
				return 0, nil, err
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				return status, body, nil
			}
		}
	case length >= 0:
		body := make([]byte, length)
		_, err := io.ReadFull(c.br, body)
		return status, body, err
	default:
		return 0, nil, errors.New("response without Content-Length or chunked body (keep-alive impossible)")
	}
}

// close closes every connection.
func (lc *loadClient) close() {
	for _, c := range lc.conns {
		if c.c != nil {
			_ = c.c.Close()
			c.c = nil
		}
	}
}
