// Package pgcluster runs private PostgreSQL servers for tests that need a
// cluster of their own: a streaming standby, a dump restored into a new
// cluster, a server whose transaction-id epoch was reset with pg_resetwal.
// The shared server on 5432 serves every other test.
//
// A [Dir] is a temporary directory that holds data directories; [Dir.InitDB]
// creates one, [Dir.Start] serves it on a free loopback port with trust
// authentication, [Dir.StartOn] serves it again on the port of a server
// that was stopped ([Server.Stop]) or crashed ([Server.Crash]), and
// [Dir.Run] runs any other binary (pg_dump, pg_restore, pg_basebackup,
// pg_resetwal). When the test runs as root, every binary runs
// as the postgres OS user, since the server refuses to run as root.
package pgcluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinDir finds the PostgreSQL server binaries: the directory in
// KUMIKO_PG_BINDIR, else the newest /usr/lib/postgresql/*/bin, else the
// directory of postgres on PATH. It returns an error when none is found.
func BinDir() (string, error) {
	if d := os.Getenv("KUMIKO_PG_BINDIR"); d != "" {
		return d, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	p, err := exec.LookPath("postgres")
	if err != nil {
		return "", errors.New("pgcluster: no PostgreSQL server binaries (set KUMIKO_PG_BINDIR, or install them under /usr/lib/postgresql/*/bin)")
	}
	return filepath.Dir(p), nil
}

// Credential returns the credential to run the PostgreSQL binaries with:
// nil (the current user) unless the process runs as root, then the postgres
// OS user's. It returns an error when running as root without a postgres
// user.
func Credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, the servers need a postgres OS user to run as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: uid of postgres: %w", err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: gid of postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Dir is a temporary directory, owned by the user the binaries run as, in
// which a test keeps its data directories.
type Dir struct {
	// Path is the directory; the servers' Unix sockets live in it too.
	Path string
	// Bin is the directory of the PostgreSQL binaries.
	Bin  string
	t    testing.TB
	cred *syscall.Credential
}

// New creates a Dir and removes it when the test ends, after the servers
// started in it have stopped. It fails the test when the binaries or, as
// root, the postgres OS user are missing; a test that may skip instead
// calls [BinDir] first.
func New(t testing.TB) *Dir {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	cred, err := Credential()
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("", "kumiko-pgcluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(base) })
	if err := os.Chmod(base, 0o700); err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if err := os.Chown(base, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	return &Dir{Path: base, Bin: bin, t: t, cred: cred}
}

// Command returns the command of the binary name with args, run in d as
// the binaries' user, with a minimal C-locale environment.
func (d *Dir) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(d.Bin, name), args...)
	cmd.Env = []string{"PATH=" + d.Bin + ":/usr/bin:/bin", "LANG=C", "LC_ALL=C", "HOME=" + d.Path}
	cmd.Dir = d.Path
	if d.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: d.cred}
	}
	return cmd
}

// Run runs the binary name with args and returns its combined output; a
// failure fails the test with that output.
func (d *Dir) Run(name string, args ...string) string {
	d.t.Helper()
	out, err := d.Command(name, args...).CombinedOutput()
	if err != nil {
		d.t.Fatalf("pgcluster: %s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// InitDB creates the data directory name inside d with initdb (superuser
// postgres, trust authentication, which admits replication connections
// from loopback too; UTF8, C locale, no sync) plus args, and returns its
// path.
func (d *Dir) InitDB(name string, args ...string) string {
	d.t.Helper()
	dir := filepath.Join(d.Path, name)
	d.Run("initdb", append([]string{"-D", dir, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"}, args...)...)
	return dir
}

// Server is a postgres process owned by a test.
type Server struct {
	// Port is its loopback port.
	Port int
	// DataDir is the data directory it serves.
	DataDir string
	// Log is the file its output goes to.
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs postgres on dataDir on a free 127.0.0.1 port (fsync off,
// max_connections 40, shared_buffers 16MB, plus the "name=value" settings),
// waits until it accepts connections, and stops it when the test ends. A
// server that exits or does not answer within 30 s fails the test with its
// log.
func (d *Dir) Start(dataDir string, settings ...string) *Server {
	d.t.Helper()
	return d.StartOn(dataDir, freePort(d.t), settings...)
}

// StartOn is [Dir.Start] on the given port: a server stopped with
// [Server.Stop] or [Server.Crash] comes back where its clients (a pool
// holding its URL) expect it. A data directory that was not shut down
// cleanly goes through crash recovery first.
func (d *Dir) StartOn(dataDir string, port int, settings ...string) *Server {
	d.t.Helper()
	s := &Server{Port: port, DataDir: dataDir, done: make(chan struct{})}
	args := []string{"-D", dataDir, "-p", strconv.Itoa(s.Port), "-k", d.Path,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=40", "-c", "shared_buffers=16MB"}
	for _, kv := range settings {
		args = append(args, "-c", kv)
	}
	s.cmd = d.Command("postgres", args...)
	logf, err := os.Create(filepath.Join(d.t.TempDir(), "postgres.log"))
	if err != nil {
		d.t.Fatal(err)
	}
	s.Log = logf.Name()
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		_ = logf.Close()
		d.t.Fatalf("pgcluster: start postgres on %s: %v", dataDir, err)
	}
	go func() { _ = s.cmd.Wait(); _ = logf.Close(); close(s.done) }()
	d.t.Cleanup(s.Stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := pgx.Connect(d.t.Context(), s.URL("postgres"))
		if err == nil {
			_ = conn.Close(d.t.Context())
			return s
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(logf.Name())
			d.t.Fatalf("pgcluster: postgres on %s exited: %s", dataDir, log)
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("pgcluster: postgres on %s does not accept connections: %v", dataDir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL returns a URL connecting to the database db as postgres.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// Stop shuts the server down (fast shutdown, which leaves the data
// directory clean for pg_resetwal or a restart) and waits; after 20 s it
// kills it. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.shutdown(syscall.SIGINT)
}

// Crash shuts the server down in immediate mode (pg_ctl stop -m
// immediate): every backend ends at once, nothing is checkpointed, and the
// next start on the data directory runs crash recovery. It waits until
// the server is gone; crashing a stopped server does nothing.
func (s *Server) Crash() {
	s.shutdown(syscall.SIGQUIT)
}

// shutdown sends sig to the postmaster and waits; after 20 s it kills it.
// A server that is not running is left alone.
func (s *Server) shutdown(sig syscall.Signal) {
	if s == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
