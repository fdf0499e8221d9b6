package pgliveness_test

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/pgliveness"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// connect opens a connection to the test server through dial (nil: direct).
func connect(t *testing.T, dial pgconnDial) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(kumikotest.AdminURL())
	require.NoError(t, err)
	if dial != nil {
		cfg.DialFunc = dial
	}
	c, err := pgx.ConnectConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

type pgconnDial = func(ctx context.Context, network, addr string) (net.Conn, error)

// waitGone waits until the backend pid has left pg_stat_activity: its
// goodbye has reached the client's socket.
func waitGone(t *testing.T, admin *pgx.Conn, pid uint32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		require.NoError(t, admin.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n))
		if n == 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "backend %d still there", pid)
		time.Sleep(5 * time.Millisecond)
	}
}

// A healthy idle connection is quiet: no ping for it (pgxpool's own rule
// for one idle longer than a second stays).
func TestQuietConnectionIsNotPinged(t *testing.T) {
	t.Parallel()
	c := connect(t, nil)
	require.NoError(t, c.Ping(t.Context()))
	require.False(t, pgliveness.Spoke(c.PgConn().Conn()))
	require.False(t, pgliveness.ShouldPing(t.Context(), pgxpool.ShouldPingParams{Conn: c, IdleDuration: 10 * time.Millisecond}))
	require.True(t, pgliveness.ShouldPing(t.Context(), pgxpool.ShouldPingParams{Conn: c, IdleDuration: 2 * time.Second}))
}

// A connection whose backend the server ended while it was idle (here
// pg_terminate_backend, as a restart's fast shutdown does to every one) has
// the server's FATAL error and the end of stream waiting: it is pinged.
func TestConnectionTheServerEndedIsPinged(t *testing.T) {
	t.Parallel()
	admin := connect(t, nil)
	c := connect(t, nil)
	pid := c.PgConn().PID()
	_, err := admin.Exec(t.Context(), `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	waitGone(t, admin, pid)
	require.True(t, pgliveness.Spoke(c.PgConn().Conn()))
	require.True(t, pgliveness.ShouldPing(t.Context(), pgxpool.ShouldPingParams{Conn: c, IdleDuration: time.Millisecond}))
	require.Error(t, c.Ping(t.Context()), "the ping the pool then sends finds it dead")
}

// A connection that ends without a word (a crashed server's backend, a
// network path that closed it: here a proxy that hangs up) has only the end
// of stream waiting: it is pinged too.
func TestConnectionClosedWithoutAWordIsPinged(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var clientSides []net.Conn
	var wg sync.WaitGroup
	defer func() { ln.Close(); wg.Wait() }()
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", "127.0.0.1:5432")
			if err != nil {
				in.Close()
				return
			}
			mu.Lock()
			clientSides = append(clientSides, in)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(out, in); out.Close() })
			wg.Go(func() { _, _ = io.Copy(in, out); in.Close() })
		}
	})
	c := connect(t, func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	})
	require.NoError(t, c.Ping(t.Context()))
	require.False(t, pgliveness.Spoke(c.PgConn().Conn()))
	mu.Lock()
	for _, s := range clientSides {
		require.NoError(t, s.(*net.TCPConn).CloseWrite()) // FIN, nothing else
	}
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !pgliveness.Spoke(c.PgConn().Conn()) {
		require.True(t, time.Now().Before(deadline), "the end of stream never showed")
		time.Sleep(time.Millisecond)
	}
	require.Error(t, c.Ping(t.Context()))
	_ = c.Close(context.Background())
	mu.Lock()
	for _, s := range clientSides {
		s.Close()
	}
	mu.Unlock()
}

// BenchmarkShouldPing is what the check adds to every acquire of a
// connection idle for less than a second, against the bare pool hook
// (pgxpool's default rule).
func BenchmarkShouldPing(b *testing.B) {
	cfg, err := pgx.ParseConfig(kumikotest.AdminURL())
	if err != nil {
		b.Fatal(err)
	}
	c, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	p := pgxpool.ShouldPingParams{Conn: c, IdleDuration: time.Millisecond}
	b.Run("framework", func(b *testing.B) {
		for b.Loop() {
			if pgliveness.ShouldPing(context.Background(), p) {
				b.Fatal("a quiet connection was pinged")
			}
		}
	})
	b.Run("idle-only", func(b *testing.B) {
		for b.Loop() {
			if p.IdleDuration > time.Second {
				b.Fatal("pinged")
			}
		}
	})
}
