// Package proctest runs real OS processes in tests: it builds binaries,
// finds free loopback addresses, starts processes with a given environment,
// collects their output and stops them with SIGKILL when the test ends.
package proctest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TailLines is how many of a process's last log lines Start's cleanup shows
// when the test failed.
const TailLines = 60

// Build runs `go build -o out pkg`; the error carries the compiler output.
func Build(pkg, out string) error {
	if b, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// FreeAddr returns a loopback address with a port that was free a moment
// ago. It fails the test when no port can be had.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("free port: %v", err)
	}
	return addr
}

// Buffer is a goroutine-safe bytes.Buffer that collects a process's output.
// The zero value is ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Proc is one started OS process.
type Proc struct {
	// Cmd is the running command; do not call its Wait.
	Cmd *exec.Cmd
	// Output collects the process's stdout and stderr.
	Output *Buffer

	name   string
	exited chan struct{}
	err    error
	code   int
}

// Start runs `bin args...` with an environment of PATH and HOME plus env
// (env wins), stdout and stderr going to the process's Output. When the
// test ends the process is killed with SIGKILL if it still runs, and the
// last TailLines lines of its output are logged if the test failed. name
// identifies the process in messages.
func Start(t testing.TB, bin, name string, env map[string]string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Output: &Buffer{}, name: name, exited: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		p.Cmd.Env = append(p.Cmd.Env, k+"="+v)
	}
	p.Cmd.Stdout = p.Output
	p.Cmd.Stderr = p.Output
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		p.code = p.Cmd.ProcessState.ExitCode()
		if p.err != nil && p.code == 0 {
			p.code = -1
		}
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("logs of %s (last lines):\n%s", p.name, Tail(p.Logs(), TailLines))
		}
	})
	return p
}

// Name returns the name the process was started with.
func (p *Proc) Name() string { return p.name }

// Kill sends SIGKILL unless the process has exited, and waits until it has.
func (p *Proc) Kill() {
	if !p.Alive() {
		return
	}
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Alive reports whether the process has not exited yet.
func (p *Proc) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error {
	return p.Cmd.Process.Signal(sig)
}

// Exited returns a channel that is closed once the process has exited.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err returns the error of waiting for the exited process (nil for exit
// status 0); it is nil while the process runs.
func (p *Proc) Err() error {
	if p.Alive() {
		return nil
	}
	return p.err
}

// State returns the state of the exited process, or nil while it runs.
func (p *Proc) State() *os.ProcessState {
	if p.Alive() {
		return nil
	}
	return p.Cmd.ProcessState
}

// Code returns the exit code of the exited process (-1 when it was killed
// by a signal or could not be waited for); it is 0 while the process runs.
func (p *Proc) Code() int {
	if p.Alive() {
		return 0
	}
	return p.code
}

// WaitExit waits up to timeout for the process to exit and returns its exit
// code as Code does; it fails the test on timeout.
func (p *Proc) WaitExit(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.name, timeout)
		return 0
	}
}

// Logs returns the process's output so far.
func (p *Proc) Logs() string { return p.Output.String() }

// Tail returns the last n lines of s, ignoring trailing newlines.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
