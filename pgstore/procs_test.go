package pgstore

// Child processes for the fault tests: the test binary started again with
// PGFAULT_ROLE naming what it plays (a role registered below), its
// arguments in PGFAULT_ARGS (JSON), talking to the parent in lines on
// stdout ("pgfault: EVENT JSON") and listening for commands on stdin (one
// word a line). A child may be started inside a network namespace.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	envRole = "PGFAULT_ROLE"
	envArgs = "PGFAULT_ARGS"
	evLine  = "pgfault: "
)

// role is what a child process does: it reads its arguments, reports
// events with out.send and reads commands with out.next.
type role func(ctx context.Context, args json.RawMessage, io *childIO) error

var roles = map[string]role{}

// childIO is the child's side of the conversation with its parent.
type childIO struct {
	mu  sync.Mutex
	in  *bufio.Scanner
	out io.Writer
}

// send reports an event to the parent.
func (c *childIO) send(event string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	fmt.Fprintf(c.out, "%s%s %s\n", evLine, event, data)
}

// next waits for the parent's next command ("" when stdin closed).
func (c *childIO) next() string {
	if !c.in.Scan() {
		return ""
	}
	return strings.TrimSpace(c.in.Text())
}

// runRole is a child's main.
func runRole(name string) int {
	r := roles[name]
	if r == nil {
		fmt.Fprintf(os.Stderr, "pgfault: no role %q\n", name)
		return 2
	}
	cio := &childIO{in: bufio.NewScanner(os.Stdin), out: os.Stdout}
	if err := r(context.Background(), json.RawMessage(os.Getenv(envArgs)), cio); err != nil {
		cio.send("failed", err.Error())
		fmt.Fprintf(os.Stderr, "pgfault: role %s: %v\n", name, err)
		return 3
	}
	cio.send("done", nil)
	return 0
}

// event is a line a child sent.
type event struct {
	Name string
	Data json.RawMessage
	At   time.Time // when the parent read it
}

// child is the parent's handle on a child process.
type child struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event
	mu     sync.Mutex
	out    strings.Builder // everything it wrote, for failure messages
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// startChild starts role in a child process with args (marshalled to
// JSON). wrap, when given, is a command the child runs under (ip netns
// exec NAME). The child is killed at the test's end if it still runs.
func startChild(t testing.TB, name string, args any, wrap ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	argv := append(append([]string(nil), wrap...), exe, "-test.run=^$")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"), envRole+"="+name, envArgs+"="+string(data))
	c := &child{t: t, name: name, cmd: cmd, events: make(chan event, 1000), exited: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.out.Write(p)
	})
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", name, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			line := sc.Text()
			c.mu.Lock()
			c.out.WriteString(line + "\n")
			c.mu.Unlock()
			if rest, ok := strings.CutPrefix(line, evLine); ok {
				ev, data, _ := strings.Cut(rest, " ")
				c.events <- event{Name: ev, Data: json.RawMessage(data), At: time.Now()}
			}
		}
		c.err = cmd.Wait()
		close(c.events)
		close(c.exited)
	}()
	t.Cleanup(func() { c.kill() })
	return c
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// output is what the child wrote so far.
func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// expect waits up to d for the event named name, skipping others it
// passes to skip (nil: other events fail the test), and decodes its data
// into v (when not nil).
func (c *child) expect(name string, d time.Duration, v any) event {
	c.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				<-c.exited
				c.t.Fatalf("child %s exited (%v) before %q; its output:\n%s", c.name, c.err, name, c.output())
			}
			if ev.Name == "failed" {
				c.t.Fatalf("child %s failed waiting for %q: %s\noutput:\n%s", c.name, name, ev.Data, c.output())
			}
			if ev.Name != name {
				continue
			}
			if v != nil {
				if err := json.Unmarshal(ev.Data, v); err != nil {
					c.t.Fatalf("child %s: event %s %s: %v", c.name, ev.Name, ev.Data, err)
				}
			}
			return ev
		case <-timeout:
			c.t.Fatalf("child %s: no %q within %s; its output:\n%s", c.name, name, d, c.output())
		}
	}
}

// tell sends the child a command.
func (c *child) tell(cmd string) {
	c.t.Helper()
	if _, err := io.WriteString(c.stdin, cmd+"\n"); err != nil {
		c.t.Fatalf("child %s: send %q: %v\noutput:\n%s", c.name, cmd, err, c.output())
	}
}

// kill SIGKILLs the child and waits for it to exit.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// wait waits up to d for the child to exit and returns Wait's error.
func (c *child) wait(d time.Duration) error {
	c.t.Helper()
	select {
	case <-c.exited:
		return c.err
	case <-time.After(d):
		c.t.Fatalf("child %s did not exit within %s; its output:\n%s", c.name, d, c.output())
		return nil
	}
}
