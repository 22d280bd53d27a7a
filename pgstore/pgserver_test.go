package pgstore

// Servers and DSNs for the fault tests: the shared test server
// (RUNSTATE_PG_DSN), a fresh schema per test, and servers of a test's own
// (RUNSTATE_PG_BIN) for tests that crash or re-address the server.

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// needEnv returns the environment variable name's value; without it the
// test skips, except under CI=true, where it fails.
func needEnv(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set under CI=true: .ci/run must export it (%s)", name, what)
		}
		t.Skipf("%s is not set (%s); see pgstore/README.md for how to run these tests", name, what)
	}
	return v
}

// pgServer is a PostgreSQL server of one test's own: started from
// RUNSTATE_PG_BIN in a temporary data directory, stopped and removed at
// the test's end.
type pgServer struct {
	bin, data string
	port      int
	listen    string // listen_addresses
	asUser    []string
	settings  []string // more -c NAME=VALUE for postgres (startServerWith)
}

// startServer initdbs and starts a server listening on 127.0.0.1 and on
// the extra addresses (an address in a test network), trusting every
// client of 127.0.0.1 and of the extra networks (CIDRs).
func startServer(t testing.TB, extraListen, extraNets []string) *pgServer {
	t.Helper()
	return startServerWith(t, extraListen, extraNets, nil)
}

// holdWAL are the settings of a server that keeps a lazy commit's WAL
// (synchronous_commit off) in its shared buffers for up to 10 s: the WAL
// writer wakes every 10 s (the most wal_writer_delay allows) and nothing
// else writes WAL out early (no background writer, no autovacuum, no
// timed checkpoint), so that a crash right after a lazy commit loses it.
var holdWAL = []string{"wal_writer_delay=10000ms", "bgwriter_lru_maxpages=0", "autovacuum=off", "checkpoint_timeout=1h"}

// startServerWith is startServer with the server settings (NAME=VALUE, as
// postgres -c takes them) for every start.
func startServerWith(t testing.TB, extraListen, extraNets, settings []string) *pgServer {
	t.Helper()
	bin := needEnv(t, "RUNSTATE_PG_BIN", "the directory of PostgreSQL's server binaries, for tests that start their own server")
	data, err := os.MkdirTemp("", "pgfault-server-")
	if err != nil {
		t.Fatal(err)
	}
	s := &pgServer{bin: bin, data: data, port: freePort(t), listen: strings.Join(append([]string{"127.0.0.1"}, extraListen...), ","), settings: settings}
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
		s.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	t.Cleanup(func() {
		_ = s.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "stop")
		os.RemoveAll(s.data)
	})
	if out, err := s.output("initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-locale"); err != nil {
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
	s.start(t)
	return s
}

func (s *pgServer) cmd(name string, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), s.asUser...), filepath.Join(s.bin, name)), args...)
	return exec.Command(argv[0], argv[1:]...)
}

func (s *pgServer) output(name string, args ...string) ([]byte, error) {
	return s.cmd(name, args...).CombinedOutput()
}

func (s *pgServer) run(name string, args ...string) error {
	out, err := s.output(name, args...)
	if err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// start starts the server and waits until it accepts connections.
func (s *pgServer) start(t testing.TB) {
	t.Helper()
	opts := fmt.Sprintf("-c listen_addresses=%s -p %d -k %s -c max_connections=200", s.listen, s.port, s.data)
	for _, kv := range s.settings {
		opts += " -c " + kv
	}
	if err := s.run("pg_ctl", "-D", s.data, "-l", filepath.Join(s.data, "server.log"), "-w", "-t", "60", "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.data, "server.log"))
		t.Fatalf("start the test server: %v\nserver.log:\n%s", err, log)
	}
}

// dsn is the server's DSN on host (an address it listens on).
func (s *pgServer) dsn(host string) string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", net.JoinHostPort(host, strconv.Itoa(s.port)))
}

// freePort is a TCP port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// poll calls ok every step until it returns true or d has passed, and
// returns how long that took and whether ok said true.
func poll(d, step time.Duration, ok func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if ok() {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(step)
	}
}

// waitFor polls ok every 10 ms for up to d, and fails the test naming
// what it waited for.
func waitFor(t *testing.T, d time.Duration, ok func() bool, what string) {
	t.Helper()
	if _, done := poll(d, 10*time.Millisecond, ok); !done {
		t.Fatalf("no %s within %v", what, d)
	}
}

// crash stops the server as a crash would (pg_ctl stop -m immediate: no
// checkpoint, the next start replays the WAL).
func (s *pgServer) crash(t testing.TB) {
	t.Helper()
	if err := s.run("pg_ctl", "-D", s.data, "-m", "immediate", "-w", "stop"); err != nil {
		t.Fatal(err)
	}
}
