//go:build unix

package pgstore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// crashNow crashes the server as 'pg_ctl stop -m immediate' does (SIGQUIT
// to the postmaster: every process exits at once, nothing more is written,
// the next start replays the WAL), without pg_ctl's start-up time, and
// waits until the postmaster is gone. kill are processes of the server
// that the test stopped (stopWALWriter), SIGKILLed once the postmaster has
// been told to quit: a stopped process would not exit, and one continued
// could write before it takes its SIGQUIT.
func crashNow(t testing.TB, s *pgServer, kill ...int) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(s.Data, "postmaster.pid"))
	require.NoError(t, err, "the test server's postmaster.pid")
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	require.NoError(t, err, "postmaster.pid: %q", first)
	require.NoError(t, syscall.Kill(pid, syscall.SIGQUIT))
	for _, k := range kill {
		require.NoError(t, syscall.Kill(k, syscall.SIGKILL), "kill the stopped server process %d", k)
	}
	_, gone := poll(30*time.Second, 10*time.Millisecond, func() bool { return syscall.Kill(pid, 0) != nil })
	require.True(t, gone, "the postmaster (pid %d) did not exit within 30 s of SIGQUIT", pid)
}

// TestServerCrashLosingALazyBeginStopsItsSession: a Begin, acknowledged to
// the Run from a lazy commit (synchronous_commit off), is lost when the
// server crashes before its WAL writer flushed it (a server of the test's
// own that holds lazy commits' WAL back, holdWAL, its WAL writer stopped
// from before the begin to the crash); the server starts again. Every
// record acknowledged by a synced commit is there, byte for byte; the
// begin is not. The session does not go on as if it were: the
// Stage's Complete fails with runstate.ErrSessionLost (its batch finds
// the run's head before the position the session read) and records
// nothing, and the Stage's context ends with that cause, so its work is
// never recorded complete on a ledger without its begin. A new Open in the
// same working directory resumes the run: the stage begins again as
// attempt 1 and completes; the ledger verifies.
//
// Twice: with the session's batches under the lock, and betting on the
// head it knows (the Complete's batch is then a bet on a head the crash
// took back: its roll-back finds the begin gone, ErrSessionLost too).
func TestServerCrashLosingALazyBeginStopsItsSession(t *testing.T) {
	for _, c := range []struct {
		name  string
		quiet int
	}{{"locked", 1 << 30}, {"bet", 0}} {
		t.Run(c.name, func(t *testing.T) {
			old := minQuiet
			minQuiet = c.quiet
			defer func() { minQuiet = old }()
			serverCrashLosingALazyBegin(t, c.quiet == 0)
		})
	}
}

func serverCrashLosingALazyBegin(t *testing.T, bet bool) {
	srv := startServerWith(t, nil, nil, holdWAL)
	ctx := context.Background()
	db, err := Connect(ctx, srv.DSN("127.0.0.1")+"&schema=lostbegin")
	require.NoError(t, err)
	defer db.Close()
	dir := t.TempDir()
	opts := &runstate.Options{Request: "lost begin"}

	ps := db.Store("run").(*store)
	run, err := runstate.OpenStore(ps, dir, opts)
	require.NoError(t, err)
	defer run.Close()
	require.NoError(t, run.Do(ctx, "fetch", func(context.Context, *runstate.Stage) error { return nil }))
	synced := readAll(t, db.Store("run")) // Do's complete was synced: these are durable

	walWriter := stopWALWriter(t, db)
	st, err := run.Begin(ctx, "build")
	require.NoError(t, err, "the lazy begin is acknowledged")
	var write, insert string
	require.NoError(t, db.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text, pg_current_wal_insert_lsn()::text`).Scan(&write, &insert))
	crashNow(t, srv, walWriter)
	srv.Start(t)
	t.Logf("at the crash the server had written its WAL up to %s, inserted up to %s", write, insert)

	after := readAll(t, db.Store("run"))
	require.Len(t, after, len(synced), "the crash lost the lazy begin (write lsn %s, insert lsn %s): the server settings %v and the stopped WAL writer must hold its WAL back", write, insert, holdWAL)
	for i := range synced {
		assert.True(t, bytes.Equal(synced[i], after[i]), "acknowledged record %d is there, byte for byte", i+1)
	}

	if bet {
		// The Complete's batch bets once the session holds its lock
		// again: on the head it knows, the begin the crash took back.
		deadline := time.Now().Add(20 * time.Second)
		for {
			ps.ses.mu.Lock()
			held := ps.ses.conn != nil
			ps.ses.mu.Unlock()
			if held || time.Now().After(deadline) {
				require.True(t, held, "the session holds its lock again after the restart")
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ps.opt.mu.Lock()
	bets0 := ps.opt.bets
	ps.opt.mu.Unlock()
	err = st.Complete()
	if bet {
		ps.opt.mu.Lock()
		assert.Greater(t, ps.opt.bets, bets0, "the Complete's batch was a bet")
		ps.opt.mu.Unlock()
	}
	require.Error(t, err, "the session goes on as if its lost begin were there")
	assert.ErrorIs(t, err, runstate.ErrSessionLost)
	select {
	case <-st.Context().Done():
		assert.ErrorIs(t, context.Cause(st.Context()), runstate.ErrSessionLost, "the stage's work is stopped for the lost session")
	case <-time.After(10 * time.Second):
		t.Error("the stage's context was not cancelled after its session was lost")
	}
	assert.Len(t, readAll(t, db.Store("run")), len(synced), "the lost session recorded nothing")
	assert.ErrorIs(t, run.Close(), runstate.ErrReadOnly, "the lost session's Run cannot write its close record")

	again, err := db.Open(ctx, "run", dir, opts)
	require.NoError(t, err, "a new Open resumes the run")
	defer again.Close()
	st2, err := again.Begin(ctx, "build")
	require.NoError(t, err, "the stage whose begin was lost can be begun again")
	assert.Equal(t, 1, st2.Attempt(), "the ledger has no attempt of it")
	require.NoError(t, st2.Complete())
	_, err = again.Begin(ctx, "fetch")
	assert.ErrorIs(t, err, runstate.ErrDone, "the stage acknowledged before the crash stays done")
	require.NoError(t, again.Close())

	recs := ledger(t, db, "run")
	assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, "build"), "one begin, one complete, in the new session")
	assert.Equal(t, again.Session(), sessionOf(recs, "build", "complete", 1))
	assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, "fetch"))
	rep, err := db.Verify(ctx, "run")
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep.Problems)
}
