package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The load client keeps one connection per worker alive across responses
// with a Content-Length, chunked responses (with trailers) and errors.
func TestLoadClientKeepsConnectionsAlive(t *testing.T) {
	var conns []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("X-Test") != "yes" {
			http.Error(w, "bad request "+r.Method, http.StatusBadRequest)
			return
		}
		conns = append(conns, r.RemoteAddr)
		switch r.URL.Path {
		case "/chunked":
			w.Header().Set("Trailer", "X-Done")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
			w.(http.Flusher).Flush() // forces chunked encoding
			_, _ = w.Write([]byte("!"))
			w.Header().Set("X-Done", "1")
		case "/fail":
			http.Error(w, "failed: "+string(body), http.StatusTeapot)
		default:
			_, _ = w.Write(append([]byte("echo "), body...))
		}
	}))
	srv.Start()
	defer srv.Close()
	lc := newLoadClient(strings.TrimPrefix(srv.URL, "http://"), 1)
	defer lc.close()
	ctx := t.Context()
	h := header{"X-Test", "yes"}

	status, body, err := lc.post(ctx, 0, "/echo?x=1", []byte(`{"a":1}`), h)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, `echo {"a":1}`, string(body))

	status, body, err = lc.post(ctx, 0, "/chunked", []byte(`{"b":2}`), h)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	require.Equal(t, `{"b":2}!`, string(body))

	status, body, err = lc.post(ctx, 0, "/fail", []byte(`x`), h)
	require.NoError(t, err)
	require.Equal(t, http.StatusTeapot, status)
	require.Equal(t, "failed: x\n", string(body))

	status, _, err = lc.post(ctx, 0, "/echo", []byte(`{}`))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, status, "without the header")

	require.Len(t, conns, 3)
	require.Equal(t, conns[0], conns[1], "one connection for every request")
	require.Equal(t, conns[0], conns[2])
}
