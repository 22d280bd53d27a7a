// Package pgtest starts PostgreSQL servers of a test's own, for the tests
// of pgstore and of its command that crash, restart or re-address the
// server: initdb into a temporary data directory from RUNSTATE_PG_BIN,
// pg_ctl start on a free port, stopped and removed when the test ends.
// For tests only; a Server is not safe for concurrent use.
package pgtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Need returns the environment variable name's value; without it the test
// skips, except under CI (set to anything: .ci/run sets CI=1 where the
// caller has not set it), where it fails, as testDSN does.
func Need(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set and CI is: .ci/run must export it (%s)", name, what)
		}
		t.Skipf("%s is not set (%s); see pgstore/README.md for how to run these tests", name, what)
	}
	return v
}

// Server is a PostgreSQL server of one test's own.
type Server struct {
	Bin, Data string
	Port      int
	Listen    string   // listen_addresses
	AsUser    []string // the command prefix that runs a server binary as postgres, when the test runs as root
	Settings  []string // more -c NAME=VALUE for postgres, at every Start

	mu       sync.Mutex
	starting chan struct{} // closed when Restart's start has returned
}

// Start initdbs and starts a server listening on 127.0.0.1 and on the
// extra addresses (an address in a test network), trusting every client
// of 127.0.0.1 and of the extra networks (CIDRs), with settings
// (NAME=VALUE, as postgres -c takes them) at every start. Without
// RUNSTATE_PG_BIN the test skips (Need).
func Start(t testing.TB, extraListen, extraNets, settings []string) *Server {
	t.Helper()
	bin := Need(t, "RUNSTATE_PG_BIN", "the directory of PostgreSQL's server binaries, for tests that start their own server")
	data, err := os.MkdirTemp("", "pgfault-server-")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Bin: bin, Data: data, Port: FreePort(t), Listen: strings.Join(append([]string{"127.0.0.1"}, extraListen...), ","), Settings: settings}
	if os.Geteuid() == 0 { // initdb and postgres refuse to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the test server needs a user postgres to run as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(data, uid, gid); err != nil {
			t.Fatal(err)
		}
		s.AsUser = []string{"runuser", "-u", "postgres", "--"}
	}
	t.Cleanup(func() {
		_ = s.Run("pg_ctl", "-D", s.Data, "-m", "immediate", "-w", "stop")
		os.RemoveAll(s.Data)
	})
	if out, err := s.Output("initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-locale"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range extraNets {
		fmt.Fprintf(hba, "host all all %s trust\n", n)
	}
	hba.Close()
	s.Start(t)
	return s
}

// Cmd is the command that runs the server binary name with args.
func (s *Server) Cmd(name string, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), s.AsUser...), filepath.Join(s.Bin, name)), args...)
	return exec.Command(argv[0], argv[1:]...)
}

// Output runs the server binary name and returns what it printed.
func (s *Server) Output(name string, args ...string) ([]byte, error) {
	return s.Cmd(name, args...).CombinedOutput()
}

// Run runs the server binary name; its error names it, with its output.
func (s *Server) Run(name string, args ...string) error {
	out, err := s.Output(name, args...)
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// Start starts the server and waits until it accepts connections.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

func (s *Server) start() error {
	opts := fmt.Sprintf("-c listen_addresses=%s -p %d -k %s -c max_connections=200", s.Listen, s.Port, s.Data)
	for _, kv := range s.Settings {
		opts += " -c " + kv
	}
	if err := s.Run("pg_ctl", "-D", s.Data, "-l", filepath.Join(s.Data, "server.log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.Data, "server.log"))
		return fmt.Errorf("start the test server: %v\nserver.log:\n%s", err, log)
	}
	return nil
}

// Restart stops the server (pg_ctl stop -m fast: every connection ended
// with 57P01, what was committed kept) and starts it again after down, in
// a goroutine of its own, so that the test meanwhile meets a server that
// is not there. The test's end, and the next Stop, Crash or Restart, wait
// for the start to return: the server accepts connections before pg_ctl
// start -w has seen it ready (it looks ten times a second), and a stop in
// between made that start fail.
func (s *Server) Restart(t testing.TB, down time.Duration) {
	t.Helper()
	s.Stop(t, "fast")
	started := make(chan struct{})
	s.mu.Lock()
	s.starting = started
	s.mu.Unlock()
	go func() {
		defer close(started)
		time.Sleep(down)
		if err := s.start(); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { <-started })
}

// Stop stops the server with pg_ctl's mode (smart, fast, immediate) and
// waits until it is down, after a start Restart began has returned.
func (s *Server) Stop(t testing.TB, mode string) {
	t.Helper()
	s.mu.Lock()
	starting := s.starting
	s.mu.Unlock()
	if starting != nil {
		<-starting
	}
	if err := s.Run("pg_ctl", "-D", s.Data, "-m", mode, "-w", "stop"); err != nil {
		t.Fatal(err)
	}
}

// Crash stops the server as a crash would (pg_ctl stop -m immediate: no
// checkpoint, the next start replays the WAL).
func (s *Server) Crash(t testing.TB) {
	t.Helper()
	s.Stop(t, "immediate")
}

// DSN is the server's DSN on host (an address it listens on).
func (s *Server) DSN(host string) string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", net.JoinHostPort(host, strconv.Itoa(s.Port)))
}

// FreePort is a TCP port nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
