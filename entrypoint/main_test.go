package entrypoint_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// binary is the kumiko binary the process tests run, built once.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kumiko-entrypoint-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	binary = filepath.Join(dir, "kumiko")
	build := exec.Command("go", "build", "-o", binary, "github.com/kumiko-go/kumiko/cmd/kumiko")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build kumiko: %v\n%s", err, out)
		_ = os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		// go-redis probes a Redis that refused its dials from a goroutine
		// of the pool, which sleeps a second between probes and ends at
		// the first probe after its client closed.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
