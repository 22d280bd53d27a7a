package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// terminateLockBackend ends (pg_terminate_backend) the server backend of
// the lock connection of the session that process pid opened, in the
// schema of db, and fails the test unless there was one.
func terminateLockBackend(t *testing.T, db *pgstore.DB, pid int) {
	t.Helper()
	n := overSessionLocks(t, db, pid, "count(pg_terminate_backend(l.pid))")
	require.Equal(t, 1, n, "the lock connection of process %d", pid)
}

// sessionLocks counts the advisory locks held of the sessions that
// process pid opened, in the schema of db.
func sessionLocks(t *testing.T, db *pgstore.DB, pid int) int {
	t.Helper()
	return overSessionLocks(t, db, pid, "count(*)")
}

// overSessionLocks evaluates the aggregate count over the granted
// advisory locks (l) of the sessions that process pid opened, in the
// schema of db, on a connection of its own.
func overSessionLocks(t *testing.T, db *pgstore.DB, pid int, count string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("RUNSTATE_PG_DSN"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT `+count+` FROM pg_locks l
		JOIN `+pgx.Identifier{db.Schema()}.Sanitize()+`.sessions s ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
		AND l.classid = ((s.lock_key >> 32) & 4294967295)::oid AND l.objid = (s.lock_key & 4294967295)::oid
		WHERE s.pid = $1`, pid).Scan(&n))
	return n
}

// waitFor polls cond every 20 ms for at most 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after 10 s: %s", what)
		}
	}
}

// A session whose lock connection is cut (pg_terminate_backend, a
// pooler's or a firewall's reset) while exec runs its stage takes its
// lock again and records the stage complete, also when its own Open
// recorded another session's stage interrupted: that record names this
// session as its writer, not as gone.
func TestExecGoesOnWhenItsLockConnectionIsCut(t *testing.T) {
	dsn := testDSN(t)
	addr := address(dsn, "cut")
	w := filepath.Join(t.TempDir(), "w")
	res := runIn("plan", w, "-at", addr, "-request", "cut the lock connection", "killed", "cut")
	require.Equal(t, 0, res.code, res.err)
	db, err := pgstore.ConnectReadOnly(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	state := func(stage string) string {
		st, err := db.Inspect(context.Background(), "cut")
		require.NoError(t, err)
		s, _ := st.Stage(stage)
		return s.State
	}

	// A session killed in its stage: the next one's Open records it
	// interrupted.
	killed := exec.Command(bin, "exec", w, "killed", "--", "sleep", "10")
	require.NoError(t, killed.Start())
	waitFor(t, "stage killed running", func() bool { return state("killed") == runstate.StateRunning })
	require.Equal(t, 1, sessionLocks(t, db, killed.Process.Pid), "the session's lock, held")
	require.NoError(t, killed.Process.Kill())
	killed.Wait()
	// The server drops the killed session's lock when its backend sees
	// the connection closed: milliseconds, longer on a busy machine (53
	// ms seen at load 7, and the next Open took the session for alive).
	waitFor(t, "the killed session's lock released", func() bool { return sessionLocks(t, db, killed.Process.Pid) == 0 })

	started := filepath.Join(t.TempDir(), "started")
	cmd := exec.Command(bin, "exec", w, "cut", "--", "sh", "-c", `touch "$0"; sleep 2`, started)
	errb := &syncBuffer{}
	cmd.Stderr = errb
	require.NoError(t, cmd.Start())
	waitFor(t, "the stage's command started", func() bool { _, err := os.Stat(started); return err == nil })
	terminateLockBackend(t, db, cmd.Process.Pid)
	require.NoError(t, cmd.Wait(), "exec exits 0: %s", errb.String())
	assert.NotContains(t, errb.String(), "names this session gone")
	assert.Equal(t, runstate.StateComplete, state("cut"))
	log := runIn("log", addr)
	require.Equal(t, 0, log.code, log.err)
	assert.Regexp(t, `  interrupted  killed#1 `, log.out)
	assert.Equal(t, 1, strings.Count(log.out, "  complete     cut#1 "), log.out)
}

// log -follow goes on when its connection is ended (pg_terminate_backend,
// as a server restart or a failover ends it): it says so on standard
// error, tries again, says when the server answers, and shows every
// record appended meanwhile once; SIGINT still ends it with 0.
func TestLogFollowGoesOnWhenItsConnectionIsCut(t *testing.T) {
	dsn, db, w := runOne(t)
	app := "follower-" + db.Schema()
	cmd, errb, nextWithin, lines := follow(t, dsn, app)
	next := func() string { t.Helper(); return nextWithin(10 * time.Second) }
	for _, ev := range []string{"create", "open", "close"} {
		assert.Contains(t, next(), "  "+ev+" ")
	}
	time.Sleep(3 * pollEvery) // it polls

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("RUNSTATE_PG_DSN"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n))
	require.NotZero(t, n, "the follower's connections")
	time.Sleep(3 * pollEvery) // it found the connection gone

	r, err := db.Open(ctx, "one", w, &runstate.Options{Request: "the first run"})
	require.NoError(t, err)
	require.NoError(t, r.Skip(ctx, "docs", "nothing to document"))
	require.NoError(t, r.Close())
	for _, ev := range []string{"  4  .*  open ", "  5  .*  skip +docs +nothing to document$", "  6  .*  close "} {
		assert.Regexp(t, ev, next())
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, cmd.Wait(), "exit 0 on SIGINT; stderr %s", errb.String())
	assert.Contains(t, errb.String(), "runstate log -follow tries again every 1s until the server answers")
	assert.Contains(t, errb.String(), "the server answers again: following the run after seq 3")
	for l := range lines {
		t.Errorf("a line after SIGINT: %s", l)
	}
}

// A read the server's statement_timeout (a user's, a database's) ends
// says what to do: give the command's connections a longer one in the
// address; that address then reads the run.
func TestReadsEndedByStatementTimeoutSayWhatToDo(t *testing.T) {
	dsn, db, w := runOne(t)
	ctx := context.Background()
	r, err := db.Open(ctx, "one", w, &runstate.Options{Request: "the first run"})
	require.NoError(t, err)
	reason := strings.Repeat("a long reason; ", 300)
	for i := range 1500 {
		require.NoError(t, r.Skip(ctx, fmt.Sprintf("s%04d", i), reason))
	}
	require.NoError(t, r.Close())

	short := address(dsn+"&statement_timeout=1", "one") // 1 ms: as a role's statement_timeout
	for _, cmd := range []string{"status", "log", "export", "verify", "next"} {
		res := runIn(cmd, short)
		assert.Equal(t, 1, res.code, "%s: %s", cmd, res.err)
		assert.Contains(t, res.err, "SQLSTATE 57014", cmd) // "statement timeout", or on a busy machine "user request" (timeoutAdvice)
		assert.Contains(t, res.err, "add statement_timeout=0 (or a longer time, in ms) to the address", cmd)
		assert.NotContains(t, res.err, "check that the server runs", "%s: the server answered", cmd)
	}
	res := runIn("exec", w, "build", "-at", short, "--", "true")
	assert.Equal(t, 125, res.code, res.err)
	assert.Contains(t, res.err, "add statement_timeout=0 (or a longer time, in ms) to the address", "exec")
	res = runIn("export", address(dsn+"&statement_timeout=0", "one"))
	assert.Equal(t, 0, res.code, res.err)
	assert.Equal(t, 1505, strings.Count(res.out, "\n"), "create, open, close; open, 1500 skips, close")
}

// A schema newer than the command's is refused by a pipeline command
// with the advice to upgrade the program, not with the advice for an
// older schema (-request upgrades it), which would be refused again.
func TestPipelineCommandsOnANewerSchemaSayToUpgradeTheProgram(t *testing.T) {
	_, db, w := runOne(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("RUNSTATE_PG_DSN"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "INSERT INTO "+pgx.Identifier{db.Schema()}.Sanitize()+".schema_version (version) VALUES ($1)", pgstore.SchemaVersion+1)
	require.NoError(t, err)
	for _, args := range [][]string{
		{"exec", w, "build", "--", "true"},
		{"plan", w, "build"},
		{"exec", w, "build", "-request", "the first run", "--", "true"},
	} {
		res := runIn(args...)
		assert.Equal(t, 125, res.code, "%v: %s", args, res.err)
		assert.Contains(t, res.err, "newer than the", args)
		assert.NotContains(t, res.err, "upgrades it when given -request", args)
	}
	st, err := db.Inspect(ctx, "one")
	require.NoError(t, err)
	assert.Equal(t, int64(3), st.Seq, "nothing recorded")
}

// A schema older than the command's is upgraded by a pipeline command
// given -request in the working directory of a run it holds (the
// directory's logs/run.json names the run's id: its create record's),
// and the command then runs the stage there.
func TestPipelineCommandUpgradesAnOlderSchemaForItsWorkingDirectory(t *testing.T) {
	_, db, w := runOne(t)
	ctx := context.Background()
	pc := adminConn(t)
	// Version 3: migration 0004 undone.
	_, err := pc.Exec(ctx, strings.ReplaceAll(`DROP INDEX {s}.outputs_inline;
		ALTER TABLE {s}.outputs DROP CONSTRAINT outputs_data_sum, DROP CONSTRAINT outputs_blob_fkey, DROP COLUMN blob, DROP COLUMN data;
		ALTER TABLE {s}.outputs ADD CONSTRAINT outputs_sha256_fkey FOREIGN KEY (sha256) REFERENCES {s}.blobs;
		DELETE FROM {s}.schema_version WHERE version = 4`, "{s}", pgx.Identifier{db.Schema()}.Sanitize()))
	require.NoError(t, err)

	res := runIn("exec", w, "build", "--", "true")
	assert.Equal(t, 125, res.code, res.err)
	assert.Contains(t, res.err, "a pipeline command upgrades it when given -request TEXT")
	res = runIn("exec", w, "build", "-request", "the first run", "--", "true")
	require.Equal(t, 0, res.code, res.err)
	var v int
	require.NoError(t, pc.QueryRow(ctx, "SELECT max(version) FROM "+pgx.Identifier{db.Schema()}.Sanitize()+".schema_version").Scan(&v))
	assert.Equal(t, pgstore.SchemaVersion, v, "upgraded by -request")
	st, err := db.Inspect(ctx, "one")
	require.NoError(t, err)
	s, _ := st.Stage("build")
	assert.Equal(t, runstate.StateComplete, s.State)
}

// An operator command through a connection that takes no writes (a role
// or database with default_transaction_read_only on, a standby) says so,
// and does not speak of creating the run, which exists.
func TestOperatorCommandOnAReadOnlyConnectionSaysSo(t *testing.T) {
	p := newPair(t)
	ro := address(p.dsn+"&default_transaction_read_only=on", "billing")
	res := runIn("approve", ro, "execute", "-by", "alice")
	assert.Equal(t, 1, res.code, res.err)
	assert.Contains(t, res.err, "cannot open run billing for writing in ")
	assert.Contains(t, res.err, "the server takes no writes from this connection")
	assert.NotContains(t, res.err, "create run")
	st, err := p.db.Inspect(context.Background(), "billing")
	require.NoError(t, err)
	s, _ := st.Stage("execute")
	assert.Equal(t, runstate.StateAwaiting, s.State, "nothing recorded")
}

// The advice for a statement the server canceled: a timeout, reported as
// such or, when the timer races the statement's end, as a user's request;
// none for other errors.
func TestTimeoutAdvice(t *testing.T) {
	for msg, want := range map[string]string{
		"canceling statement due to statement timeout": "the server's statement_timeout",
		"canceling statement due to user request":      "the server canceled it: a statement_timeout",
	} {
		got := timeoutAdvice(fmt.Errorf("reading: %w", &pgconn.PgError{Code: "57014", Message: msg}))
		assert.Contains(t, got, want, msg)
		assert.Contains(t, got, "add statement_timeout=0", msg)
	}
	assert.Empty(t, timeoutAdvice(&pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}))
	assert.Empty(t, timeoutAdvice(errors.New("no server")))
}

// A read command, or exec, behind a lock (a schema upgrade's ALTER
// TABLE, a VACUUM FULL, a LOCK TABLE) says, after a few seconds, which
// server process holds it and how to end it, then goes on when the lock
// is released: it waited without a word.
func TestReadCommandsSayWhichLockTheyWaitFor(t *testing.T) {
	dsn, db, w := runOne(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("RUNSTATE_PG_DSN"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{db.Schema(), "records"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	type waiting struct {
		args     []string
		env      string // PGAPPNAME, when set
		cmd      *exec.Cmd
		out, err *syncBuffer
	}
	var cmds, named []*waiting
	for _, c := range []struct {
		args []string
		env  string
	}{
		{args: []string{"status", address(dsn, "one")}},
		{args: []string{"export", address(dsn, "one")}},
		{args: []string{"exec", w, "build", "--", "true"}},
		{args: []string{"status", w}}, // its run's id is read first
		// Connections named by the user: others may have that name, and
		// their waits are not this command's: nothing is said.
		{args: []string{"status", address(dsn, "one") + "&application_name=agents"}},
		{args: []string{"status", address(dsn, "one")}, env: "mymonitor"},
	} {
		w := &waiting{args: c.args, env: c.env, cmd: exec.Command(bin, c.args...), out: &syncBuffer{}, err: &syncBuffer{}}
		w.cmd.Stdout, w.cmd.Stderr = w.out, w.err
		if c.env != "" {
			w.cmd.Env = append(os.Environ(), "PGAPPNAME="+c.env)
		}
		require.NoError(t, w.cmd.Start())
		if c.env != "" || strings.Contains(c.args[1], "application_name") {
			named = append(named, w)
		} else {
			cmds = append(cmds, w)
		}
		t.Cleanup(func() { w.cmd.Process.Kill(); w.cmd.Wait() })
	}
	start := time.Now()
	want := fmt.Sprintf("this command waits for a lock that server process %d holds (user ", pid)
	for _, w := range cmds {
		for !strings.Contains(w.err.String(), want) {
			if time.Since(start) > time.Minute {
				t.Fatalf("%v: after a minute no note of the lock: %q", w.args, w.err.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		assert.Contains(t, w.err.String(), `idle in transaction, its transaction open `, "the holder's state")
		assert.Contains(t, w.err.String(), `its last query "LOCK TABLE `, "the holder's query")
		assert.Contains(t, w.err.String(), fmt.Sprintf("SELECT pg_cancel_backend(%d) cancels a query it runs, pg_terminate_backend(%d) ends it", pid, pid))
		assert.Empty(t, w.out.String(), "%v: nothing read yet", w.args)
	}
	// Past noAnswer (a working directory's run id was read within it, and
	// failed behind the lock without a word), and the named ones had
	// their chances to say something too.
	time.Sleep(time.Until(start.Add(noAnswer + 2*time.Second)))
	// Still waiting, not failed (a failure would be on standard error):
	// the note alone, or nothing.
	for _, w := range cmds {
		assert.Equal(t, 1, strings.Count(w.err.String(), "\n"), "%v: %s", w.args, w.err.String())
	}
	for _, w := range named {
		assert.Empty(t, w.err.String(), "%v %s", w.args, w.env)
	}
	require.NoError(t, tx.Rollback(ctx))
	for _, w := range append(cmds, named...) {
		require.NoError(t, w.cmd.Wait(), "%v went on: %s", w.args, w.err.String())
	}
	for _, w := range cmds {
		assert.Equal(t, 1, strings.Count(w.err.String(), "waits for a lock"), "%v: said once", w.args)
	}
	for _, w := range named {
		assert.NotContains(t, w.err.String(), "waits for a lock", "%v %s", w.args, w.env)
		assert.Contains(t, w.out.String(), "one", "%v %s went on", w.args, w.env)
	}
	assert.Contains(t, cmds[0].out.String(), "one", "status went on")
	assert.Contains(t, cmds[1].out.String(), `"ev":"create"`, "export went on")
	assert.Contains(t, cmds[2].err.String(), "build", "exec went on")
	assert.Contains(t, cmds[3].out.String(), "one", "status of the working directory went on")
}
