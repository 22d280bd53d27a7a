package pgstore

// A machine of the test's own: a network namespace joined to the host by a
// veth pair, so that a process inside it can be cut off the network (the
// link goes down: no FIN, no RST, packets just vanish), as when a machine
// dies or its network fails.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// machine is a network namespace with a veth link to the host.
type machine struct {
	name         string // the namespace
	hostIf, nsIf string
	hostIP, nsIP string // the /30's two addresses
	network      string // the /30, for pg_hba.conf
}

// newMachine makes a namespace and its link, removed at the test's end. It
// skips (and says why) where the test cannot make one: not root, or no ip
// command / no netns support.
func newMachine(t testing.TB) *machine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("machine-death tests need root (ip netns add); run them as root, as CI does")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("machine-death tests need the ip command (iproute2): " + err.Error())
	}
	// A /30 of its own per process and test: 10.231.X.Y/30.
	n := (os.Getpid()*7 + len(t.Name())*131) % (256 * 64)
	a, b := n/64, (n%64)*4
	m := &machine{
		name:   fmt.Sprintf("pgfault%d", os.Getpid()%100000),
		hostIf: fmt.Sprintf("pgfh%d", os.Getpid()%100000),
		nsIf:   fmt.Sprintf("pgfn%d", os.Getpid()%100000),
		hostIP: fmt.Sprintf("10.231.%d.%d", a, b+1),
		nsIP:   fmt.Sprintf("10.231.%d.%d", a, b+2),
	}
	m.network = fmt.Sprintf("10.231.%d.%d/30", a, b)
	if out, err := exec.Command("ip", "netns", "add", m.name).CombinedOutput(); err != nil {
		t.Skipf("machine-death tests need network namespaces (ip netns add failed: %v: %s)", err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "link", "del", m.hostIf).Run()
		_ = exec.Command("ip", "netns", "del", m.name).Run()
	})
	for _, c := range [][]string{
		{"ip", "link", "add", m.hostIf, "type", "veth", "peer", "name", m.nsIf},
		{"ip", "link", "set", m.nsIf, "netns", m.name},
		{"ip", "addr", "add", m.hostIP + "/30", "dev", m.hostIf},
		{"ip", "link", "set", m.hostIf, "up"},
		{"ip", "netns", "exec", m.name, "ip", "addr", "add", m.nsIP + "/30", "dev", m.nsIf},
		{"ip", "netns", "exec", m.name, "ip", "link", "set", m.nsIf, "up"},
		{"ip", "netns", "exec", m.name, "ip", "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("set up the test machine: %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return m
}

// wrap is the command prefix that runs a program on the machine.
func (m *machine) wrap() []string { return []string{"ip", "netns", "exec", m.name} }

// cut takes the link down: from now on nothing gets through, and neither
// side is told.
func (m *machine) cut(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", m.hostIf, "down").CombinedOutput(); err != nil {
		t.Fatalf("cut the test machine's link: %v: %s", err, out)
	}
}

// restore brings the link up again.
func (m *machine) restore(t testing.TB) {
	t.Helper()
	if out, err := exec.Command("ip", "link", "set", m.hostIf, "up").CombinedOutput(); err != nil {
		t.Fatalf("restore the test machine's link: %v: %s", err, out)
	}
}

// newMachineServer makes a test machine (newMachine) and a server that
// listens to it too, and connects to the server from here (schema netns),
// closed at the test's end.
func newMachineServer(t *testing.T) (*machine, *pgServer, *DB) {
	t.Helper()
	m := newMachine(t)
	srv := startServer(t, []string{m.hostIP}, []string{m.network})
	db, err := Connect(context.Background(), srv.DSN("127.0.0.1")+"&schema=netns")
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return m, srv, db
}

// A machine holding a stage vanishes (its link cut): the parent's Begin
// takes the stage over within userTimeout + 2 s; when the network comes
// back, the cut-off process's Complete fails with ErrSessionLost; one
// complete per attempt (attempt 2's, the parent's).
func TestRunMachineDeathTakeoverAndFence(t *testing.T) {
	m, srv, db := newMachineServer(t)
	ctx := context.Background()
	run, err := db.Open(ctx, "run", t.TempDir(), &runstate.Options{Request: "pgfault"})
	require.NoError(t, err)
	defer run.Close()
	ch := startChild(t, "stageholder", stageHolderArgs{runArgs{DSN: srv.DSN(m.hostIP) + "&schema=netns", Run: "run", Dir: t.TempDir()}, "held"}, m.wrap()...)
	var h holding
	ch.expect("holding", time.Minute, &h)
	_, err = run.Begin(ctx, "held")
	require.ErrorIs(t, err, runstate.ErrBusy)
	time.Sleep(2 * pingEvery)

	m.cut(t)
	st, took := takeOver(t, run, "held", userTimeout+20*time.Second, 10*time.Millisecond)
	t.Logf("machine death -> stage taken over after %v (tcp_user_timeout %v)", took.Round(time.Millisecond), userTimeout)
	assert.LessOrEqual(t, took, userTimeout+2*time.Second, "takeover slower than tcp_user_timeout + 2 s")
	assert.Equal(t, 2, st.Attempt())

	m.restore(t)
	// The cut-off session is lost (lostAfter without its lock, or the
	// record naming it gone once it can ask): its stage is stopped.
	ch.tell("context")
	var sc stageContext
	ch.expect("context", time.Minute, &sc)
	assert.True(t, sc.Lost, "the cut-off process's stage context must end with ErrSessionLost; got %q", sc.Cause)
	time.Sleep(time.Second)
	ch.tell("complete")
	var res stageResult
	ch.expect("completed", time.Minute, &res)
	assert.True(t, res.Lost, "the cut-off process's Complete must fail with ErrSessionLost; got %q", res.Err)
	require.NoError(t, st.Complete())
	recs := ledger(t, db, "run")
	assert.Equal(t, map[int]int{2: 1}, completesOf(recs, "held"), "completes of held by attempt")
	checkInterrupted(t, recs, "held", h)
}

// The same for a session alone on its run, which sent the held stage's
// begin ahead of its reply on its pipeline connection: the machine
// vanishes; a session opened afterwards (its Open waits for the vanished
// session's run lock) takes the stage over, as attempt 2, within
// userTimeout + 5 s of the cut: the server ends both of the vanished
// session's connections (the lock connection's, and the pipeline's, whose
// key keeps the session alive, by the same keepalives and
// tcp_user_timeout), and finds the begin it sent.
func TestRunMachineDeathAloneTakeover(t *testing.T) {
	m, srv, db := newMachineServer(t)
	ctx := context.Background()
	ch := startChild(t, "aheadholder", aheadArgs{runArgs: runArgs{DSN: srv.DSN(m.hostIP) + "&schema=netns", Run: "run", Dir: t.TempDir()}}, m.wrap()...)
	var r aheadReport
	ch.expect("holding", time.Minute, &r)
	require.Equal(t, r.SentBefore+1, r.SentNow, "held's begin went ahead of its reply")
	require.True(t, advisoryHeld(ctx, db, pipeKey(r.Session)), "the vanishing session's pipeline key is held")

	m.cut(t)
	start := time.Now()
	run, err := db.Open(ctx, "run", t.TempDir(), &runstate.Options{Request: "ahead"})
	require.NoError(t, err)
	defer run.Close()
	st, _ := takeOver(t, run, "held", userTimeout+30*time.Second, 10*time.Millisecond)
	took := time.Since(start)
	t.Logf("machine death of a session alone -> stage taken over after %v (tcp_user_timeout %v)", took.Round(time.Millisecond), userTimeout)
	assert.LessOrEqual(t, took, userTimeout+5*time.Second, "takeover slower than tcp_user_timeout + 5 s")
	assert.Equal(t, 2, st.Attempt(), "the vanished session's attempt counts")
	require.NoError(t, st.Complete())
	checkInterrupted(t, ledger(t, db, "run"), "held", holding{Session: r.Session})
	m.restore(t)
}
