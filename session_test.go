package runstate_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// These tests kill real processes: the test binary runs itself as a child
// (TestI3Child, selected by I3_CHILD), which opens a run, does some work
// and stops at the interesting moment; the parent kills it there
// (os.Process.Kill: SIGKILL on Unix), as cmd/go's lockedfile tests do.

const i3ChildEnv = "I3_CHILD"

// TestI3Child is not a test: it is the body of the child processes that
// the tests in this file start. Without I3_CHILD it returns at once.
func TestI3Child(t *testing.T) {
	name := os.Getenv(i3ChildEnv)
	if name == "" {
		return
	}
	dir := os.Getenv("I3_DIR")
	r, err := runstate.Open(dir, i3Options())
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	ctx := context.Background()
	ready := func(format string, args ...any) {
		fmt.Printf("READY "+format+"\n", args...)
		_ = os.Stdout.Sync()
		time.Sleep(time.Hour) // until the parent kills this process
	}
	switch name {
	case "begin":
		// A stage begun, its work in progress.
		if _, err := r.Begin(ctx, os.Getenv("I3_STAGE")); err != nil {
			fmt.Println("ERROR", err)
			os.Exit(2)
		}
		ready("%s", r.Session())
	case "effect":
		// An effect in flight: I3_WHEN says where it stops.
		url := os.Getenv("I3_URL")
		_, err := r.Effect(ctx, "ticket", runstate.Effect{
			Request: map[string]string{"title": "flaky test"},
			Do: func(ctx context.Context, key string) (json.RawMessage, error) {
				if os.Getenv("I3_WHEN") == "before-send" {
					ready("%s", key) // the intent is durable; nothing sent
				}
				receipt, err := postMessage(ctx, url, key)
				if err != nil {
					fmt.Println("ERROR", err)
					os.Exit(2)
				}
				ready("%s", key) // the receiver has it; no confirm yet
				return receipt, nil
			},
		})
		fmt.Println("ERROR effect returned", err)
		os.Exit(2)
	}
	fmt.Println("ERROR unknown child", name)
	os.Exit(2)
}

// i3Child is a child process stopped at its READY line.
type i3Child struct {
	cmd  *exec.Cmd
	info string // what follows READY
}

// startChild runs child name with env and waits for its READY line.
func startChild(t *testing.T, name string, env ...string) *i3Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestI3Child$", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{i3ChildEnv + "=" + name}, env...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &i3Child{cmd: cmd}
	t.Cleanup(func() { c.kill() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("child %s ended before READY", name)
			}
			if info, ok := strings.CutPrefix(line, "READY "); ok {
				c.info = info
				go func() { // keep draining
					for range lines {
					}
				}()
				return c
			}
			if strings.HasPrefix(line, "ERROR") {
				t.Fatalf("child %s: %s", name, line)
			}
		case <-timeout:
			t.Fatalf("child %s: no READY within a minute", name)
		}
	}
}

// kill ends the child abruptly and waits for it to be gone.
func (c *i3Child) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}

func sessionLocks(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "logs", "sessions"))
	require.NoError(t, err)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestSessionLockHeldForLife(t *testing.T) {
	dir := t.TempDir()
	r, err := runstate.Open(dir, i3Options())
	require.NoError(t, err)
	assert.Equal(t, []string{r.Session() + ".lock"}, sessionLocks(t, dir))
	r2 := i3Open(t, dir, nil)
	assert.ElementsMatch(t, []string{r.Session() + ".lock", r2.Session() + ".lock"}, sessionLocks(t, dir))
	require.NoError(t, r.Close())
	assert.Equal(t, []string{r2.Session() + ".lock"}, sessionLocks(t, dir), "Close removes the session's lock file")

	// A stale lock file (no process holds it) is cleaned up by the next Open.
	stale := filepath.Join(dir, "logs", "sessions", "0191c1d2-0000-7000-8000-000000000000.lock")
	require.NoError(t, os.WriteFile(stale, nil, 0o644))
	r3 := i3Open(t, dir, nil)
	assert.NoFileExists(t, stale)
	assert.ElementsMatch(t, []string{r2.Session() + ".lock", r3.Session() + ".lock"}, sessionLocks(t, dir), "live sessions' locks stay")
}

// A stage begun by a live session is busy for every other session: one in
// the same process, one in another.
func TestBeginBusyInLiveSession(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := i3Open(t, dir, nil)
	b := i3Open(t, dir, nil)
	st, err := a.Begin(ctx, "execute")
	require.NoError(t, err)
	_, err = a.Begin(ctx, "execute")
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), "this session")
	_, err = b.Begin(ctx, "execute")
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), a.Session())
	require.ErrorIs(t, b.Skip(ctx, "execute", "not needed"), runstate.ErrBusy)
	require.NoError(t, st.Complete())
	_, err = b.Begin(ctx, "execute")
	require.ErrorIs(t, err, runstate.ErrDone)
}

func TestBeginBusyThenInterruptedWhenChildKilled(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	child := startChild(t, "begin", "I3_DIR="+dir, "I3_STAGE=execute")
	childSession := child.info

	r := i3Open(t, dir, nil)
	assert.Contains(t, sessionLocks(t, dir), childSession+".lock")
	_, err := r.Begin(ctx, "execute")
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), childSession)
	st, err := r.Status()
	require.NoError(t, err)
	es, _ := st.Stage("execute")
	assert.Equal(t, runstate.StateRunning, es.State)

	child.kill()
	stage, err := r.Begin(ctx, "execute")
	require.NoError(t, err, "a dead session's stage may be begun again")
	assert.Equal(t, 2, stage.Attempt())
	require.NoError(t, stage.Complete())

	recs := i3Records(t, dir)
	assert.Equal(t, []string{"begin", "interrupted", "begin", "complete"}, i3Evs(recs, "execute"))
	for _, rec := range recs {
		if rec.Ev == "interrupted" {
			assert.Equal(t, 1, rec.Attempt)
			assert.Equal(t, r.Session(), rec.Session, "written by the session that found it")
			assert.Contains(t, rec.Reason, childSession)
		}
	}
	st, err = r.Status()
	require.NoError(t, err)
	assert.Equal(t, 1, st.Metrics.Interrupted)
	assert.Zero(t, st.Metrics.DuplicatedWork)
}

func TestOpenRecordsInterruptedAndCleansStaleLock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	child := startChild(t, "begin", "I3_DIR="+dir, "I3_STAGE=verify")
	child.kill()
	childLock := child.info + ".lock"
	assert.Contains(t, sessionLocks(t, dir), childLock, "a killed session leaves its lock file")

	r := i3Open(t, dir, nil)
	assert.Equal(t, []string{r.Session() + ".lock"}, sessionLocks(t, dir), "Open removed the dead session's lock file")
	st, err := r.Status()
	require.NoError(t, err)
	vs, _ := st.Stage("verify")
	assert.Equal(t, runstate.StateInterrupted, vs.State)
	require.Len(t, st.Blockers, 1)
	assert.Equal(t, "interrupted", st.Blockers[0].Kind)
	assert.Equal(t, "verify", st.Blockers[0].Stage)
	next, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(next), "verify interrupted")
	assert.Equal(t, 1, st.Metrics.Interrupted)
	assert.Equal(t, 2, st.Metrics.Sessions)
	assert.Equal(t, 1, st.Metrics.ResumedSessions)

	stage, err := r.Begin(ctx, "verify")
	require.NoError(t, err)
	assert.Equal(t, 2, stage.Attempt())
	require.NoError(t, stage.Complete())
	recs := i3Records(t, dir)
	assert.Equal(t, []string{"begin", "interrupted", "begin", "complete"}, i3Evs(recs, "verify"))
	// The interrupted record comes with the new session's open.
	for i, rec := range recs {
		if rec.Ev == "interrupted" {
			require.Less(t, i+1, len(recs))
			assert.Equal(t, "open", recs[i+1].Ev)
			assert.Equal(t, r.Session(), recs[i+1].Session)
		}
	}
}

// The crash windows of an effect, with a real process killed in each.
func TestEffectKilledBetweenIntentAndSend(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rc := newReceiver(t)
	child := startChild(t, "effect", "I3_DIR="+dir, "I3_URL="+rc.srv.URL, "I3_WHEN=before-send")
	childKey := child.info

	r := i3Open(t, dir, nil)
	e := runstate.Effect{Request: map[string]string{"title": "flaky test"}, Do: sendTo(rc.srv.URL), Check: checkAt(rc.srv.URL)}
	_, err := r.Effect(ctx, "ticket", e)
	require.ErrorIs(t, err, runstate.ErrBusy, "the child's session is still attempting it")
	child.kill()
	require.NoError(t, r.Close())

	r = i3Open(t, dir, nil)
	es := i3Effect(t, r, "ticket")
	assert.Equal(t, runstate.EffectInDoubt, es.State, "Open marks the dead session's intent as in doubt, not yet a person's business")
	st, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, 1, st.Metrics.EffectsInDoubt)
	assert.Zero(t, st.Metrics.EffectsUnconfirmed)
	require.Len(t, st.Blockers, 1)
	assert.Equal(t, "ticket", st.Blockers[0].Key)
	assert.Equal(t, "in-doubt", st.Blockers[0].Kind)

	var keys []string
	e.Do = func(ctx context.Context, key string) (json.RawMessage, error) {
		keys = append(keys, key)
		return postMessage(ctx, rc.srv.URL, key)
	}
	got, err := r.Effect(ctx, "ticket", e)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"m-1"}`, string(got))
	assert.Equal(t, []string{childKey}, keys, "Check found nothing: sent once, with the child's key")
	posts, messages, checks := rc.stats()
	assert.Equal(t, []string{childKey}, posts)
	assert.Equal(t, 1, messages)
	assert.Equal(t, 1, checks)
	assert.Equal(t, []string{"intent", "unconfirmed", "intent", "confirm"}, i3Evs(i3Records(t, dir), "ticket"))
	st, err = r.Status()
	require.NoError(t, err)
	assert.Zero(t, st.Metrics.EffectsUnconfirmed)
	assert.Zero(t, st.Metrics.EffectsInDoubt)
	assert.Zero(t, st.Metrics.EffectsDuplicated)
	assert.Empty(t, st.Blockers)
}

func TestEffectKilledBetweenSendAndConfirm(t *testing.T) {
	for _, tc := range []struct {
		name  string
		check string // found, not-found, error, absent
	}{
		{"check finds it", "found"},
		{"check does not find it", "not-found"},
		{"check fails", "error"},
		{"no check", "absent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			rc := newReceiver(t)
			child := startChild(t, "effect", "I3_DIR="+dir, "I3_URL="+rc.srv.URL)
			childKey := child.info
			posts, messages, _ := rc.stats()
			require.Equal(t, []string{childKey}, posts, "the receiver got the POST")
			require.Equal(t, 1, messages)
			child.kill()

			var keys []string
			e := runstate.Effect{
				Request: map[string]string{"title": "flaky test"},
				Do: func(ctx context.Context, key string) (json.RawMessage, error) {
					keys = append(keys, key)
					return postMessage(ctx, rc.srv.URL, key)
				},
				Check: checkAt(rc.srv.URL),
			}
			switch tc.check {
			case "not-found":
				rc.forget(childKey) // it was lost on the receiver's side
			case "error":
				rc.set(func(rc *receiver) { rc.checkFails = true })
			case "absent":
				e.Check = nil
			}
			r := i3Open(t, dir, nil)
			got, err := r.Effect(ctx, "ticket", e)
			recs := i3Records(t, dir)
			switch tc.check {
			case "found":
				require.NoError(t, err)
				assert.JSONEq(t, `{"id":"m-1"}`, string(got))
				assert.Empty(t, keys, "not sent again")
				assert.Equal(t, []string{"intent", "unconfirmed", "confirm"}, i3Evs(recs, "ticket"))
				assert.Equal(t, "confirmed by Check", recs[len(recs)-1].Note)
			case "not-found":
				require.NoError(t, err)
				assert.JSONEq(t, `{"id":"m-2"}`, string(got))
				assert.Equal(t, []string{childKey}, keys, "sent again with the same key")
				assert.Equal(t, []string{"intent", "unconfirmed", "intent", "confirm"}, i3Evs(recs, "ticket"))
			case "error", "absent":
				require.ErrorIs(t, err, runstate.ErrUnconfirmed)
				assert.Contains(t, err.Error(), "runstate resolve")
				assert.Empty(t, keys)
				es := i3Effect(t, r, "ticket")
				assert.Equal(t, runstate.EffectUnconfirmed, es.State)
				st, err := r.Status()
				require.NoError(t, err)
				require.Len(t, st.Blockers, 1)
				assert.Equal(t, "unconfirmed", st.Blockers[0].Kind)
				next, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
				require.NoError(t, err)
				assert.Contains(t, string(next), "effect ticket unconfirmed")

				// Asking again changes nothing and writes nothing.
				n := len(recs)
				_, err = r.Effect(ctx, "ticket", e)
				require.ErrorIs(t, err, runstate.ErrUnconfirmed)
				assert.Len(t, i3Records(t, dir), n)
				assert.Empty(t, keys)
			}
			if tc.check == "error" {
				// A person looked: it landed as m-1.
				require.NoError(t, r.Resolve(ctx, "ticket", runstate.Resolution{Sent: true, Receipt: json.RawMessage(`{"id":"m-1"}`), By: "ann", Note: "seen in the tracker"}))
				got, err := r.Effect(ctx, "ticket", e)
				require.NoError(t, err)
				assert.JSONEq(t, `{"id":"m-1"}`, string(got))
				assert.Empty(t, keys)
				last := i3Records(t, dir)
				assert.Equal(t, "ann", last[len(last)-1].By)
			}
			if tc.check == "absent" {
				// A person says it did not go out: sent again, same key; the
				// receiver honours the key and answers with the first ticket.
				require.NoError(t, r.Resolve(ctx, "ticket", runstate.Resolution{By: "ann"}))
				got, err := r.Effect(ctx, "ticket", e)
				require.NoError(t, err)
				assert.JSONEq(t, `{"id":"m-1","replayed":true}`, string(got))
				assert.Equal(t, []string{childKey}, keys)
			}
			_, messages, _ = rc.stats()
			if tc.check == "not-found" {
				assert.Equal(t, 1, messages, "the forgotten one was sent again, once")
			} else {
				assert.Equal(t, 1, messages, "one message on the receiver")
			}
			st, err := r.Status()
			require.NoError(t, err)
			assert.Zero(t, st.Metrics.EffectsDuplicated)
			assert.Equal(t, 2, st.Metrics.Sessions)
		})
	}
}
