// Package jobstest gives tests of jobs a private Redis server that they can
// stop and start again, to exercise outages without touching the shared
// Redis other tests use.
package jobstest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a redis-server process owned by one test (no persistence).
type Redis struct {
	// Port is the server's port on 127.0.0.1; it stays the same across
	// Stop and Start.
	Port int
	// URL is redis://127.0.0.1:<Port>/0.
	URL string

	t   testing.TB
	dir string
	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartRedis starts redis-server (from PATH) on a free port and stops it
// when the test ends. The test is skipped when redis-server is missing.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("jobstest: free port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	r := &Redis{Port: port, URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), t: t, dir: t.TempDir()}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start starts the server (again) on its port and waits until it answers.
func (r *Redis) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("jobstest: start redis-server: %v", err)
	}
	r.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("jobstest: redis-server on %d does not answer: %v", r.Port, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server with SIGKILL (an outage: nothing is saved) and
// waits until it is gone.
func (r *Redis) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Client returns a client of the server, closed when the test ends.
func (r *Redis) Client(t testing.TB) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(r.URL)
	if err != nil {
		t.Fatalf("jobstest: %v", err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
