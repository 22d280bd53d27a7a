package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/examples/agent/tickets"
)

const srcDir = "../../testdata/gopkg"

// TestMain runs the agent itself when the tests start this binary as a
// child process (AGENT_TEST_ARGS holds its arguments as JSON), so that a
// test can kill a real agent process at a crash point.
func TestMain(m *testing.M) {
	if args := os.Getenv("AGENT_TEST_ARGS"); args != "" {
		var list []string
		if err := json.Unmarshal([]byte(args), &list); err != nil {
			panic(err)
		}
		os.Exit(realMain(context.Background(), list, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func runAgent(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := realMain(context.Background(), args, &out, &errOut)
	t.Logf("agent %s → %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return code, out.String() + errOut.String()
}

func fileHashes(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		out[e.Name()] = string(data)
	}
	return out
}

func storedTickets(t *testing.T, path string) []tickets.Ticket {
	t.Helper()
	srv, err := tickets.NewServer(path)
	require.NoError(t, err)
	return srv.Tickets()
}

func stageStates(t *testing.T, dir string) map[string]string {
	t.Helper()
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	out := map[string]string{}
	for _, s := range st.Stages {
		out[s.Name] = s.State
	}
	return out
}

func TestAgentReviewThenTicket(t *testing.T) {
	dir := t.TempDir()
	before := fileHashes(t, srcDir)

	code, out := runAgent(t, "-dir", dir, "-src", srcDir)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "runstate approve "+dir+" await-review -by NAME")
	assert.Equal(t, map[string]string{
		"inspect": "complete", "plan": "complete", "execute/stats.go": "complete", "execute/words.go": "complete",
		"verify": "complete", "await-review": "awaiting", "complete": "pending",
	}, stageStates(t, dir))
	verify, err := os.ReadFile(filepath.Join(dir, "artifacts", "verify.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(verify), "$ go vet ./...\n")
	assert.Contains(t, string(verify), "$ go test ./...\n")
	assert.Equal(t, 2, strings.Count(string(verify), "-> exit status 0"), "go vet and go test passed:\n%s", verify)
	stats, err := os.ReadFile(filepath.Join(dir, "work", "gopkg", "stats.go"))
	require.NoError(t, err)
	assert.Contains(t, string(stats), "// Histogram is a struct type with the fields Buckets and Width.\ntype Histogram struct")
	assert.Contains(t, string(stats), "// Add takes x (float64).\nfunc (h *Histogram) Add")
	next, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(next), "await-review awaiting")
	assert.Empty(t, storedTickets(t, filepath.Join(dir, "ticketd", "tickets.json")), "no ticket before the review")

	// Waiting is not an error; running again changes nothing.
	code, out = runAgent(t, "-dir", dir, "-src", srcDir)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "waiting for a person")

	code, out = runAgent(t, "-dir", dir, "-src", srcDir, "-approve-as", "tester")
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "ticket T-1 filed")
	list := storedTickets(t, filepath.Join(dir, "ticketd", "tickets.json"))
	require.Len(t, list, 1)
	assert.Equal(t, "gopkg: doc comments added, reviewed by tester", list[0].Title)
	receipt, err := os.ReadFile(filepath.Join(dir, "artifacts", "ticket.json"))
	require.NoError(t, err)
	assert.Contains(t, string(receipt), `"id":"T-1"`)

	// A finished run: every stage skipped, no second ticket.
	code, out = runAgent(t, "-dir", dir, "-src", srcDir, "-approve-as", "tester")
	require.Equal(t, 0, code, out)
	assert.Equal(t, 7, strings.Count(out, "already complete, evidence holds"))
	assert.Len(t, storedTickets(t, filepath.Join(dir, "ticketd", "tickets.json")), 1)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 7, st.Done)
	assert.Zero(t, st.Remaining)
	assert.Empty(t, st.Blockers)
	assert.Equal(t, 4, st.Metrics.Sessions)
	assert.GreaterOrEqual(t, st.Metrics.SkippedOnResume, 7+5)
	assert.Zero(t, st.Metrics.DuplicatedWork)
	assert.Zero(t, st.Metrics.EffectsDuplicated)

	assert.Equal(t, before, fileHashes(t, srcDir), "the source package is never modified")
}

// agentChild is an agent process stopped at its crash point.
type agentChild struct{ cmd *exec.Cmd }

// startAgent runs the agent in a child process with -crash-how hang and
// waits until it hangs at its crash point.
func startAgent(t *testing.T, args ...string) *agentChild {
	t.Helper()
	enc, err := json.Marshal(append(args, "-crash-how", "hang"))
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "AGENT_TEST_ARGS="+string(enc))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &agentChild{cmd: cmd}
	t.Cleanup(c.kill)
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the agent ended before its crash point")
			}
			t.Log("child: " + line)
			if strings.HasPrefix(line, "hanging here") {
				go func() {
					for range lines {
					}
				}()
				return c
			}
		case <-timeout:
			t.Fatal("the agent did not reach its crash point within 2 minutes")
		}
	}
}

func (c *agentChild) kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// Killing the agent between the ticket's intent and the POST, then between
// the POST and its confirmation, files exactly one ticket.
func TestAgentKilledAroundTicketPost(t *testing.T) {
	dir := t.TempDir()
	srv, err := tickets.NewServer("")
	require.NoError(t, err)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	args := []string{"-dir", dir, "-src", srcDir, "-ticketd", hs.URL, "-approve-as", "tester"}

	child := startAgent(t, append(args, "-crash-at", "before-post")...)
	child.kill()
	assert.Zero(t, srv.Posts(), "killed before the POST")

	child = startAgent(t, append(args, "-crash-at", "after-post")...)
	require.Len(t, srv.Tickets(), 1, "the service filed it")
	child.kill()

	code, out := runAgent(t, args...)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "T-1 already filed by an earlier session that died before recording it")
	assert.Len(t, srv.Tickets(), 1, "no second ticket")
	assert.Equal(t, 1, srv.Posts(), "no second POST either")

	var evs []string
	require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error {
		if strings.HasPrefix(r.Key, "ticket:") {
			evs = append(evs, r.Ev)
		}
		return nil
	}))
	assert.Equal(t, []string{"intent", "unconfirmed", "intent", "unconfirmed", "confirm"}, evs)
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 7, st.Done)
	assert.Equal(t, 2, st.Metrics.Interrupted, "complete was interrupted twice")
	assert.Zero(t, st.Metrics.EffectsDuplicated)
	assert.Zero(t, st.Metrics.EffectsUnconfirmed)
	assert.Equal(t, 1, st.Metrics.EffectsDeduplicated)
	assert.Zero(t, st.Metrics.DuplicatedWork)
}

// A service that accepts the ticket for later (202) leaves the effect
// pending; a later run confirms it by asking, without a second POST.
func TestAgentPendingTicket(t *testing.T) {
	dir := t.TempDir()
	srv, err := tickets.NewServer("")
	require.NoError(t, err)
	srv.AcceptDelay = time.Hour
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	args := []string{"-dir", dir, "-src", srcDir, "-ticketd", hs.URL, "-approve-as", "tester"}

	code, out := runAgent(t, args...)
	require.Equal(t, 1, code, out)
	assert.Contains(t, out, "accepted the ticket but has not filed it yet")
	code, out = runAgent(t, args...)
	require.Equal(t, 1, code, out)
	assert.Equal(t, 1, srv.Posts(), "pending: asked, not sent again")

	require.NoError(t, srv.Release()) // the service files the accepted ticket now
	code, out = runAgent(t, args...)
	require.Equal(t, 0, code, out)
	assert.Contains(t, out, "ticket T-1 filed: the service accepted it earlier")
	assert.Equal(t, 1, srv.Posts())
	assert.Len(t, srv.Tickets(), 1)
	assert.Equal(t, "complete", stageStates(t, dir)["complete"])
}

func TestAgentUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-dir", t.TempDir(), "extra"},
		{"-dir", t.TempDir(), "-crash-at", "sometime"},
		{"-dir", t.TempDir(), "-crash-how", "politely"},
	} {
		code, _ := runAgent(t, args...)
		assert.Equal(t, 2, code, "%q", args)
	}
	code, out := runAgent(t, "-dir", t.TempDir(), "-src", "no/such/dir")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "no/such/dir")
}
