package web_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/require"

	"github.com/kumiko-go/kumiko/features/orders"
	"github.com/kumiko-go/kumiko/framework"
	"github.com/kumiko-go/kumiko/framework/auth"
	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/framework/web"
)

// readTimeout is the short HTTP read timeout of these tests.
const readTimeout = 400 * time.Millisecond

// serveWithTimeouts serves a Server with the orders feature and two slow
// routes through web.NewHTTPServer with readTimeout and idle, and returns
// its address, a token and the database. The slow routes read their body
// (POST) or have none (GET), sleep for three read timeouts, and answer
// whether their request's context is still alive.
func serveWithTimeouts(t *testing.T, idle time.Duration) (addr, tok string, db *kumikotest.DB) {
	t.Helper()
	db = kumikotest.NewDB(t)
	reg := framework.NewRegistry()
	orders.Register(reg)
	rt, err := framework.NewRuntime(reg, db.Pool, nil)
	require.NoError(t, err)
	keys, err := auth.NewKeyring([]auth.Key{{ID: "k1", Secret: secret}})
	require.NoError(t, err)
	s := web.New(rt, keys, nil)
	slow := func(c echo.Context) error {
		if _, err := io.ReadAll(c.Request().Body); err != nil {
			return err
		}
		select {
		case <-c.Request().Context().Done():
			return c.String(http.StatusOK, "cancelled")
		case <-time.After(3 * readTimeout):
			return c.String(http.StatusOK, "alive")
		}
	}
	s.Echo().POST("/slow", slow, s.Authenticate)
	s.Echo().GET("/slow", slow, s.Authenticate)
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := web.NewHTTPServer("", s.Handler(), readTimeout, idle)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	tok, err = keys.Mint(auth.Principal{UserID: "u1", TenantID: "t1"}, time.Hour)
	require.NoError(t, err)
	return ln.Addr().String(), tok, db
}

// A request that runs longer than the read timeout once its body is read,
// and a GET (no body) that does, keep their context: the read deadline
// ends with the body.
func TestLongRequestsOutliveTheReadTimeout(t *testing.T) {
	t.Parallel()
	addr, tok, _ := serveWithTimeouts(t, time.Minute)
	for _, method := range []string{http.MethodPost, http.MethodGet} {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"a":1}`)
		}
		req, err := http.NewRequestWithContext(t.Context(), method, "http://"+addr+"/slow", body)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		got, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Equal(t, "alive", string(got), method)
	}
}

// stall opens a connection and sends head, then nothing more.
func stall(t *testing.T, addr, head string) net.Conn {
	t.Helper()
	conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = io.WriteString(conn, head)
	require.NoError(t, err)
	return conn
}

// answerThenEOF reads one response from conn and then the connection's end,
// and fails unless both arrive within bound.
func answerThenEOF(t *testing.T, conn net.Conn, bound time.Duration) *http.Response {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(bound)))
	r := bufio.NewReader(conn)
	res, err := http.ReadResponse(r, nil)
	require.NoError(t, err, "no answer within %s", bound)
	_, err = io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	_, err = r.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the connection stays open")
	return res
}

// A client that sends its headers and then stalls in its body is cut off
// after the read timeout: with a token the write answers 400 and persists
// nothing; without one the 401 is answered at once and the connection then
// closed, although nobody read the body.
func TestStalledBodiesAreCutOff(t *testing.T) {
	t.Parallel()
	addr, tok, db := serveWithTimeouts(t, time.Minute)
	body := `{"type":"orders:write:place","payload":{"customer":"slow","amountCents":1}}`
	head := func(auth string) string {
		return fmt.Sprintf("POST /api/write HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
			auth, len(body), body[:10])
	}

	start := time.Now()
	res := answerThenEOF(t, stall(t, addr, head("Authorization: Bearer "+tok+"\r\n")), 10*readTimeout)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.GreaterOrEqual(t, time.Since(start), readTimeout-50*time.Millisecond)
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders`).Scan(&n))
	require.Zero(t, n)

	res = answerThenEOF(t, stall(t, addr, head("")), 10*readTimeout)
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
}

// A keep-alive connection idle for the idle timeout is closed.
func TestIdleConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	addr, _, _ := serveWithTimeouts(t, 2*readTimeout)
	conn := stall(t, addr, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*readTimeout)))
	r := bufio.NewReader(conn)
	res, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	_, err = io.ReadAll(res.Body)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	start := time.Now()
	_, err = r.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the idle connection stays open")
	require.GreaterOrEqual(t, time.Since(start), readTimeout)
}
