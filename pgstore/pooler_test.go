package pgstore

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startPgbouncer starts a pgbouncer (RUNSTATE_PGBOUNCER: its binary, which
// testdb.sh sets) in pool_mode mode in front of the tests' server, and
// returns a DSN through it with a schema of the test's own. With ignore,
// it passes the startup parameters of a session's lock connection
// (ignoredParams) instead of refusing them. It is stopped when the test
// ends.
func startPgbouncer(t *testing.T, mode string, ignore bool) string {
	t.Helper()
	bin := needEnv(t, "RUNSTATE_PGBOUNCER", "pgbouncer's binary, for the tests of poolers")
	up, err := url.Parse(testDSN(t))
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "pgbouncer-") // not t.TempDir: its parent is 0700, and pgbouncer runs as postgres under root
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	port := freePort(t)
	params := "extra_float_digits"
	if ignore {
		params += "," + ignoredParams
	}
	ini := fmt.Sprintf(`[databases]
%[1]s = host=%[2]s port=%[3]s dbname=%[1]s user=%[4]s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %[5]d
unix_socket_dir =
auth_type = trust
auth_file = %[6]s
pool_mode = %[7]s
default_pool_size = 20
max_client_conn = 200
ignore_startup_parameters = %[8]s
logfile = %[9]s
pidfile = %[10]s
`, up.Path[1:], up.Hostname(), up.Port(), up.User.Username(), port, filepath.Join(dir, "users.txt"), mode, params,
		filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "users.txt"), fmt.Appendf(nil, "%q \"\"\n", up.User.Username()), 0o644))
	// Daemonized (-d) with a pidfile, and stopped by the PID it names, as
	// the server is: under runuser, killing the command started would
	// leave pgbouncer running.
	argv := []string{bin, "-d", filepath.Join(dir, "pgbouncer.ini")}
	if os.Geteuid() == 0 { // pgbouncer refuses to run as root
		require.NoError(t, os.Chmod(dir, 0o777))
		argv = append([]string{"runuser", "-u", "postgres", "--"}, argv...)
	}
	log := filepath.Join(dir, "pgbouncer.log")
	t.Cleanup(func() {
		if pid, err := os.ReadFile(filepath.Join(dir, "pgbouncer.pid")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(pid))); err == nil {
				if p, err := os.FindProcess(n); err == nil {
					_ = p.Kill()
				}
			}
		}
		if t.Failed() {
			data, _ := os.ReadFile(log)
			t.Logf("pgbouncer.log:\n%s", data)
		}
	})
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		data, _ := os.ReadFile(log)
		t.Fatalf("start pgbouncer: %v\n%s\n%s", err, out, data)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	waitFor(t, 10*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, "pgbouncer listening on "+addr)
	through := *up
	through.Host = addr
	return withSchema(through.String(), newSchema(t))
}

// Through a pooler that shares server sessions among its clients
// (transaction or statement mode), Connect refuses with what to do, before
// a session lock or a prepared statement can go to another client.
func TestConnectThroughATransactionPoolerSaysWhatToDo(t *testing.T) {
	for _, mode := range []string{"transaction", "statement"} {
		t.Run(mode, func(t *testing.T) {
			_, err := Connect(context.Background(), startPgbouncer(t, mode, true))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "one server session")
			assert.Contains(t, err.Error(), "pool_mode=session")
		})
	}
}

// A pooler that refuses the lock connection's startup parameters is named,
// with the parameters to let through.
func TestPoolerRefusingTheLockConnectionsParametersIsNamed(t *testing.T) {
	db, err := Connect(context.Background(), startPgbouncer(t, "session", false))
	require.NoError(t, err, "the pool's connections set none of them")
	defer db.Close()
	_, err = db.Open(context.Background(), "r", t.TempDir(), &runstate.Options{Request: "pooler"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unsupported startup parameter")
	assert.Contains(t, err.Error(), "ignore_startup_parameters = "+ignoredParams)
	assert.NotContains(t, err.Error(), "check that the server runs")
}

// Through a pooler in session mode a run works, and a crashed session's
// lock is freed (pgbouncer's server_reset_query, DISCARD ALL, releases it
// when the client goes): the next session takes over its running stage.
func TestRunThroughASessionPooler(t *testing.T) {
	ctx := context.Background()
	db, err := Connect(ctx, startPgbouncer(t, "session", true))
	require.NoError(t, err)
	defer db.Close()
	opts := &runstate.Options{Request: "pooler"}
	a, err := db.Open(ctx, "r", t.TempDir(), opts)
	require.NoError(t, err)
	for i := range 3 {
		require.NoError(t, a.Do(ctx, fmt.Sprintf("s%d", i), func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile("out.txt", []byte{byte('a' + i)})
		}))
	}
	_, err = a.Begin(ctx, "held")
	require.NoError(t, err)
	runstatetest.Crash(a)

	b, err := db.Open(ctx, "r", t.TempDir(), opts)
	require.NoError(t, err)
	defer b.Close()
	var st *runstate.Stage
	took, ok := poll(10*time.Second, 10*time.Millisecond, func() bool {
		st, err = b.Begin(ctx, "held")
		return err == nil
	})
	require.True(t, ok, "the crashed session's stage taken over: %v", err)
	t.Logf("taken over after %v", took)
	require.NoError(t, st.Complete())
	s, err := b.Status()
	require.NoError(t, err)
	assert.Len(t, s.Stages, 4)
	for _, x := range s.Stages {
		assert.Equal(t, runstate.StateComplete, x.State, x.Name)
	}
}

// Through a pooler in session mode, the check that resolves a commit whose
// connection was lost (resolveCommit, on connections of its own) connects
// and finds the run's records: it sets no startup parameter that pgbouncer
// refuses (search_path is one: "unsupported startup parameter").
func TestCommitCheckThroughASessionPooler(t *testing.T) {
	ctx := context.Background()
	db, err := Connect(ctx, startPgbouncer(t, "session", true))
	require.NoError(t, err)
	defer db.Close()
	r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "pooler"})
	require.NoError(t, err)
	require.NoError(t, r.Do(ctx, "s", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("out.txt", []byte("out\n"))
	}))
	require.NoError(t, r.Close())

	s := db.Store("r").(*store)
	runID, err := s.id(ctx)
	require.NoError(t, err)
	lines := readAll(t, s)
	mark := func(seq int) commitMark {
		h := sha256.Sum256(lines[seq-1])
		return commitMark{Seq: int64(seq), Hash: h[:]}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	committed, err := resolveCommit(cctx, s.connect, runID, mark(2), mark(len(lines)))
	require.NoError(t, err)
	assert.True(t, committed, "the run's records are found")
	next := commitMark{Seq: int64(len(lines) + 1), Hash: make([]byte, sha256.Size)}
	committed, err = resolveCommit(cctx, s.connect, runID, next, next)
	require.NoError(t, err)
	assert.False(t, committed, "a record that is not there is not found")
}
