//go:build unix

package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore"
	"github.com/runstate/runstate/pgstore/internal/pgtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// For pgstore's grace after a server restart (10 s in which a session
// that held its lock before is not taken for gone), status says that it
// cannot tell whether such a session is alive, and when it can: it does
// not call the session alive, nor its stage interrupted, in text, -json
// (a note on standard error, no blocker) or ls. After the grace the stage
// is interrupted.
func TestStatusInTheRestartGraceSaysItCannotTellYet(t *testing.T) {
	srv := pgtest.Start(t, nil, nil, nil)
	dsn := srv.DSN("127.0.0.1")
	addr := address(dsn, "grace")
	w := filepath.Join(t.TempDir(), "w")
	res := runIn("plan", w, "-at", addr, "-request", "a server restart", "build")
	require.Equal(t, 0, res.code, res.err)
	db, err := pgstore.ConnectReadOnly(context.Background(), dsn)
	require.NoError(t, err)
	defer db.Close()
	running := func() bool {
		st, err := db.Inspect(context.Background(), "grace")
		if err != nil {
			return false
		}
		s, _ := st.Stage("build")
		return s.State == runstate.StateRunning
	}
	cmd := exec.Command(bin, "exec", w, "build", "--", "sleep", "60")
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	waitFor(t, "stage build running", running)
	st, err := db.Inspect(context.Background(), "grace")
	require.NoError(t, err)
	s, _ := st.Stage("build")
	id := s.Session
	db.Close()

	// The server restarts, and the session dies meanwhile (a fast stop
	// writes out the begin, which its session committed lazily).
	srv.Stop(t, "fast")
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	srv.Start(t)
	started := time.Now()

	res = runIn("status", addr)
	res2 := runIn("status", "-json", addr)
	ls := runIn("ls", "-json", addr)
	if time.Since(started) > 9*time.Second {
		t.Fatalf("the status commands took %v: past the grace, they cannot show it", time.Since(started))
	}
	assert.Equal(t, 0, res.code, "nothing is known to block the run yet: %s%s", res.out, res.err)
	short := strings.ReplaceAll(id, "-", "")[24:] // as status shows it
	assert.Contains(t, res.out, "("+"pid ")
	assert.Contains(t, res.out, ", alive or gone: cannot tell)")
	assert.NotRegexp(t, `, alive\)`, res.out)
	assert.Regexp(t, `note      cannot tell whether session `+short+` is alive \(the server restarted \d+ s ago, and a session that held its lock before has 10 s from the restart to take it again: it is known alive or gone at \d\d:\d\d:\d\d UTC\): it is taken for alive, so a stage it began is not shown interrupted; run status again in \d+ s, when the session is known alive or gone`, res.out)
	assert.NotContains(t, res.out, "as the user that runs")
	assert.Contains(t, res.out, "blockers  none")

	assert.Equal(t, 0, res2.code, res2.err)
	assert.Regexp(t, `runstate: cannot tell whether session `+short+` is alive \(the server restarted \d+ s ago`, res2.err)
	var js statusJSON
	require.NoError(t, json.Unmarshal([]byte(res2.out), &js), res2.out)
	assert.False(t, js.Blocked)
	assert.Empty(t, js.Blockers)

	assert.Equal(t, 0, ls.code, ls.out+ls.err)
	var runs []struct {
		State   string
		Blocker *runstate.Blocker
	}
	require.NoError(t, json.Unmarshal([]byte(ls.out), &runs), ls.out)
	require.Len(t, runs, 1)
	assert.Equal(t, "unknown", runs[0].State)
	if assert.NotNil(t, runs[0].Blocker) {
		assert.Contains(t, runs[0].Blocker.Reason, "the server restarted ")
		assert.Regexp(t, `^run status again in \d+ s`, runs[0].Blocker.Action)
	}

	// After the grace: the session is gone, the stage interrupted.
	time.Sleep(time.Until(started.Add(10 * time.Second)))
	for {
		res = runIn("status", addr)
		if res.code == exitBlocked || time.Since(started) > 30*time.Second {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	assert.Equal(t, exitBlocked, res.code, res.out+res.err)
	assert.Contains(t, res.out, ", gone)")
	assert.Contains(t, res.out, "build (interrupted): attempt 1's session "+short+" is gone")
	assert.NotContains(t, res.out, "cannot tell")
}

// statusJSON is the part of status -json the tests read.
type statusJSON struct {
	Blocked  bool               `json:"blocked"`
	Blockers []runstate.Blocker `json:"blockers"`
}

const exitBlocked = 3

// log -follow whose server stops answering (its backend stopped: the
// connection stays open and its keepalives answer, but no reply comes)
// says so within noAnswer and some, tries again on a new connection, and
// shows every record appended meanwhile once; SIGINT still ends it with 0.
func TestLogFollowSaysWhenTheServerDoesNotAnswer(t *testing.T) {
	srv := pgtest.Start(t, nil, nil, nil)
	dsn := srv.DSN("127.0.0.1")
	ctx := context.Background()
	db, err := pgstore.Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	w := filepath.Join(t.TempDir(), "w")
	r, err := db.Open(ctx, "one", w, &runstate.Options{Request: "the first run"})
	require.NoError(t, err)
	require.NoError(t, r.Close())

	app := "frozen-follower"
	cmd, errb, next, lines := follow(t, dsn, app)
	for _, ev := range []string{"create", "open", "close"} {
		assert.Contains(t, next(10*time.Second), "  "+ev+" ")
	}
	time.Sleep(3 * pollEvery) // it polls

	// Stop the follower's backends (SIGSTOP: the kernel still answers
	// for their sockets).
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var pids []int
	require.NoError(t, conn.QueryRow(ctx, "SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity WHERE application_name = $1", app).Scan(&pids))
	require.NotEmpty(t, pids, "the follower's backends")
	for _, pid := range pids {
		require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
		t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	}
	stopped := time.Now()
	for !strings.Contains(errb.String(), "did not answer") {
		if time.Since(stopped) > noAnswer+10*time.Second {
			t.Fatalf("%v after its backends stopped, the follower has not said that the server does not answer; stderr %s", time.Since(stopped), errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, time.Since(stopped), noAnswer-pollEvery, "the note came before the server was given noAnswer")

	r, err = db.Open(ctx, "one", w, &runstate.Options{Request: "the first run"})
	require.NoError(t, err)
	require.NoError(t, r.Skip(ctx, "docs", "nothing to document"))
	require.NoError(t, r.Close())
	for _, ev := range []string{"  4  .*  open ", "  5  .*  skip +docs +nothing to document$", "  6  .*  close "} {
		assert.Regexp(t, ev, next(noAnswer+10*time.Second))
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	sig := time.Now()
	require.NoError(t, cmd.Wait(), "exit 0 on SIGINT; stderr %s", errb.String())
	assert.Less(t, time.Since(sig), closeWait+3*time.Second, "the follower exits soon after SIGINT")
	assert.Contains(t, errb.String(), "the server did not answer a read of the run's records within 10s (a server or backend stopped or hung); runstate log -follow tries again every 1s until the server answers")
	assert.Contains(t, errb.String(), "the server answers again: following the run after seq 3")
	for l := range lines {
		t.Errorf("a line after SIGINT: %s", l)
	}
}
