// Package redistest runs a private redis-server for tests that must stop
// Redis for real (the shared one on 6379 serves other tests).
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by a test, on a fixed loopback
// port that survives [Server.Stop] and [Server.Start].
type Server struct {
	t    testing.TB
	port int
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs redis-server (no persistence) on a free loopback port, waits
// until it answers, and kills it when the test ends. It skips nothing: a
// missing redis-server binary fails the test.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, port: freePort(t)}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Client returns a client of the server with short timeouts and no
// retries, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second,
		WriteTimeout: time.Second, MaxRetries: -1})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Start (re)starts the process and waits until it answers PING.
func (s *Server) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: redis-server on %s does not answer: %v", s.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the process (SIGKILL) and waits for it to exit.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Freeze stops the process (SIGSTOP) without closing anything: the kernel
// still accepts connections and takes commands, and nothing answers, as
// with a Redis that hangs. Thaw resumes it, and it answers what it got.
func (s *Server) Freeze() { s.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen process (SIGCONT).
func (s *Server) Thaw() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("redistest: %s is not running", s)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %s: %v", s, err)
	}
}

// Shared returns a client of the Redis that tests share (KUMIKO_TEST_REDIS_URL,
// default redis://127.0.0.1:6379/0), closed when the test ends; tests keep
// apart by key prefix. It fails the test when that Redis does not answer.
func Shared(t testing.TB) *redis.Client {
	t.Helper()
	url := os.Getenv("KUMIKO_TEST_REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("redistest: KUMIKO_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redistest: the tests need Redis at %s: %v", url, err)
	}
	return c
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// String implements fmt.Stringer.
func (s *Server) String() string { return fmt.Sprintf("redis-server %s", s.Addr()) }
