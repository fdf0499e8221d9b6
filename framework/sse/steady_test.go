package sse_test

import (
	"bufio"
	"cmp"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/framework/sse"
)

// TestSteadyReaderNotDropped: a client that reads steadily, only slower
// than a whole replay page arrives in one WriteTimeout, is not a client
// that "does not read": it must get its backlog without being dropped. It
// resumes over 12 MB of events (more than the sockets' buffers hold) at
// 1.5 MB/s, with a WriteTimeout of three seconds (room for the kernel,
// which wakes a blocked writer only once a good part of a full send buffer,
// megabytes, is free again).
func TestSteadyReaderNotDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, &sse.Config{WriteTimeout: 3 * time.Second})
	const n = 240
	big := strings.Repeat("z", 50_000)
	for i := range n {
		b.note(t, "acme", "memo", i, big)
	}
	log := b.logOf(t, "acme")
	require.Len(t, log, n)

	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		return cmp.Or(err, serr)
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer %s\r\n%s: %s\r\n\r\n",
		sse.Path, b.token(t, "acme"), sse.HeaderLastEventID, log[0])
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(wait)))
	// 1.5 MB/s, in reads of at most 32 KB, never pausing for long.
	const rate = 1.5e6
	began, total := time.Now(), 0
	rd := bufio.NewReader(readerFunc(func(p []byte) (int, error) {
		time.Sleep(time.Until(began.Add(time.Duration(float64(total) / rate * float64(time.Second)))))
		k, err := conn.Read(p[:min(len(p), 32<<10)])
		total += k
		return k, err
	}))
	resp, err := http.ReadResponse(rd, nil)
	require.NoError(t, err)
	// Not resp.Body.Close: it would read the endless stream to its end;
	// closing conn ends it.
	r := sse.NewReader(resp.Body)
	requireOpen(t, r)
	var got []string
	start := time.Now()
	for len(got) < n-1 {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("the stream ended after %d of %d events (%s): %v; dropped: %v", len(got), n-1, time.Since(start), err,
				b.metric(t, "kumiko_sse_dropped_clients_total"))
		}
		got = append(got, ev.ID)
	}
	t.Logf("read %d events in %s", len(got), time.Since(start))
	require.Equal(t, log[1:], got)
	require.Zero(t, b.metric(t, "kumiko_sse_dropped_clients_total"))
}
