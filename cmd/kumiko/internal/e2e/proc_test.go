package e2e_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kumiko-go/kumiko/framework/kumikotest"
	"github.com/kumiko-go/kumiko/internal/proctest"
)

// The binaries the tests run, built once by TestMain: the real kumiko
// binary, and kumiko-e2e (kumiko plus the test-only e2e feature).
var kumikoBin, e2eBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kumiko-e2e-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	kumikoBin = filepath.Join(dir, "kumiko")
	e2eBin = filepath.Join(dir, "kumiko-e2e")
	for bin, pkg := range map[string]string{
		kumikoBin: "github.com/kumiko-go/kumiko/cmd/kumiko",
		e2eBin:    "github.com/kumiko-go/kumiko/cmd/kumiko/internal/e2e/kumiko-e2e",
	} {
		if err := proctest.Build(pkg, bin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			_ = os.RemoveAll(dir)
			os.Exit(2)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// deadline bounds every wait for the processes' work.
const deadline = 90 * time.Second

// proc is one OS process of a binary.
type proc struct {
	*proctest.Proc
	name string
}

// processEnv is the environment of a `serve` process: mode, database (its
// connections carry application_name = instance, so a test can find them
// in pg_stat_activity), Redis, instance id and free ports.
func processEnv(t *testing.T, mode string, db *kumikotest.DB, redisURL, instance string, extra ...string) map[string]string {
	t.Helper()
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatalf("database url: %v", err)
	}
	q := u.Query()
	q.Set("application_name", instance)
	u.RawQuery = q.Encode()
	env := map[string]string{
		"APP_MODE":                           mode,
		"DATABASE_URL":                       u.String(),
		"DATABASE_POOL_MAX":                  "4",
		"REDIS_URL":                          redisURL,
		"JWT_SECRET":                         "e2e-test-secret-0123456789abcdef0123",
		"KUMIKO_INSTANCE_ID":                 instance,
		"KUMIKO_DISPATCHER_POLL_INTERVAL_MS": "50",
		"HTTP_ADDR":                          proctest.FreeAddr(t),
		"WORKER_HTTP_ADDR":                   proctest.FreeAddr(t),
		"LOG_LEVEL":                          "info",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

// start runs `bin serve` with env; the process is killed (SIGKILL) when the
// test ends, and its log is shown if the test failed.
func start(t *testing.T, bin, name string, env map[string]string) *proc {
	t.Helper()
	return &proc{Proc: proctest.Start(t, bin, name, env, "serve"), name: name}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() { p.Kill() }

// alive reports whether the process is still running.
func (p *proc) alive() bool { return p.Alive() }

// waitUntil polls cond every 25ms until it holds; it fails the test after
// the deadline, or at once when one of procs exited. cond returns whether
// it holds and a description of the current state for the failure message.
func waitUntil(t *testing.T, what string, procs []*proc, cond func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		ok, state := cond()
		if ok {
			return
		}
		for _, p := range procs {
			if !p.alive() {
				t.Fatalf("waiting for %s: %s exited (%v); state: %s", what, p.name, p.State(), state)
			}
		}
		if time.Now().After(end) {
			t.Fatalf("waiting for %s: not reached within %s; state: %s", what, deadline, state)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
