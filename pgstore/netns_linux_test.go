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

// A machine holding the run vanishes from the network (its link cut: no
// FIN, no RST). The server drops its session lock within tcp_user_timeout,
// so the others take it for gone within userTimeout + 2 s of the cut;
// they record it gone; when the network comes back, the cut-off process
// cannot append any more (ErrSessionLost), and wrote nothing after its
// last acknowledged record.
func TestMachineDeathTakenOverAndFenced(t *testing.T) {
	m := newMachine(t)
	srv := startServer(t, []string{m.hostIP}, []string{m.network})
	ctx := context.Background()
	db, err := Connect(ctx, srv.dsn("127.0.0.1")+"&schema=netns")
	require.NoError(t, err)
	defer db.Close()
	p := newProbe(t, db, "run")
	ch := startChild(t, "holder", holderArgs{DSN: srv.dsn(m.hostIP) + "&schema=netns", Run: "run"}, m.wrap()...)
	var h holding
	ch.expect("holding", time.Minute, &h)
	require.True(t, p.alive(h.Session))
	time.Sleep(2 * pingEvery) // the holder's pinger is talking: the cut leaves a send unacknowledged

	start := time.Now()
	m.cut(t)
	d, gone := poll(userTimeout+20*time.Second, 10*time.Millisecond, func() bool { return !p.alive(h.Session) })
	require.True(t, gone, "the cut-off session is still alive %v after the cut", d)
	t.Logf("machine death -> session gone after %v (tcp_user_timeout %v)", d.Round(time.Millisecond), userTimeout)
	assert.LessOrEqual(t, d, userTimeout+2*time.Second, "takeover slower than tcp_user_timeout + 2 s")

	// The others record it gone (as an interrupted record names it).
	var at Position
	for _, l := range readAll(t, db.Store("run")) {
		at = Position{Seq: at.Seq + 1, Hash: lineHash(l), End: at.End + int64(len(l)+1), LastLen: int64(len(l) + 1)}
	}
	_, err = eventBatch(ctx, p.st, at, p.session, "interrupted", "session "+h.Session+" is gone", 1, true)
	require.NoError(t, err)

	m.restore(t)
	time.Sleep(time.Since(start) / 10) // routes back
	ch.tell("append")
	var res appendResult
	ch.expect("appended", time.Minute, &res)
	assert.True(t, res.Lost, "the cut-off process's append must fail with ErrSessionLost; got seq %d, error %q", res.Seq, res.Err)
	assert.Equal(t, []int64{h.Seq}, sessionRecords(t, db, "run", h.Session), "the cut-off session's records: its last acknowledged one, nothing after")
}
