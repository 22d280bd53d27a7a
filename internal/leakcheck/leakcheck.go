// Package leakcheck finds goroutines that a test left running, by
// comparing the runtime's goroutine stacks before and after, with retries
// while goroutines wind down. It is a small stand-in for goleak, which the
// library module may not depend on.
package leakcheck

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Goroutine is one goroutine in a stack dump.
type Goroutine struct {
	ID    int
	Top   string // the function it is in
	Stack string // its whole trace
}

// Snapshot returns the IDs of the running goroutines.
func Snapshot() map[int]bool {
	ids := map[int]bool{}
	for _, g := range all() {
		ids[g.ID] = true
	}
	return ids
}

// Find waits up to timeout for every goroutine not in before (nil: every
// goroutine) to end, other than the caller's, the runtime's and the
// testing package's own. It returns an error listing those still running.
func Find(before map[int]bool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		left := leaked(before)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			fmt.Fprintf(&b, "%d goroutine(s) still running:\n", len(left))
			for _, g := range left {
				b.WriteString(g.Stack)
				b.WriteString("\n\n")
			}
			return fmt.Errorf("%s", strings.TrimSpace(b.String()))
		}
		time.Sleep(wait)
		if wait < 100*time.Millisecond {
			wait *= 2
		}
	}
}

func leaked(before map[int]bool) []Goroutine {
	self := currentID()
	var out []Goroutine
	for _, g := range all() {
		if g.ID == self || before[g.ID] || ignored(g) {
			continue
		}
		out = append(out, g)
	}
	return out
}

// ignored are goroutines that belong to the runtime or to package testing.
func ignored(g Goroutine) bool {
	for _, f := range []string{
		"testing.RunTests",
		"testing.(*T).Run",
		"testing.(*T).Parallel",
		"testing.(*F).Fuzz",
		"testing.runFuzzing",
		"testing.tRunner.func1",
		"testing.(*M).startAlarm",
		"testing.(*M).Run",
		"runtime.goexit",
		"os/signal.signal_recv",
		"os/signal.loop",
		"runtime.ensureSigM",
		"runtime/trace.Start",
		"main.main",
	} {
		if g.Top == f || strings.HasPrefix(g.Top, f+"(") {
			return true
		}
	}
	// A test still running (a parallel sibling, a parent waiting for its
	// subtests) is the testing package's business, not a leak.
	return strings.Contains(g.Stack, "testing.(*T).Run(") && strings.Contains(g.Stack, "chan receive") ||
		strings.Contains(g.Stack, "testing.(*T).Parallel(") ||
		strings.Contains(g.Stack, "testing.tRunner(") && strings.Contains(g.Stack, "testing.(*T).Run(")
}

func all() []Goroutine {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var gs []Goroutine
	for _, block := range bytes.Split(buf, []byte("\n\n")) {
		g, ok := parse(string(block))
		if ok {
			gs = append(gs, g)
		}
	}
	return gs
}

// parse reads "goroutine 7 [chan receive]:\nfunc(...)\n\tfile:line\n...".
func parse(block string) (Goroutine, bool) {
	head, rest, _ := strings.Cut(block, "\n")
	idStr, ok := strings.CutPrefix(head, "goroutine ")
	if !ok {
		return Goroutine{}, false
	}
	idStr, _, _ = strings.Cut(idStr, " ")
	id, err := strconv.Atoi(idStr)
	if err != nil {
		return Goroutine{}, false
	}
	top, _, _ := strings.Cut(rest, "\n")
	if i := strings.LastIndex(top, "("); i > 0 {
		top = top[:i]
	}
	return Goroutine{ID: id, Top: top, Stack: block}, true
}

func currentID() int {
	buf := make([]byte, 64)
	n := runtime.Stack(buf, false)
	g, _ := parse(string(buf[:n]))
	return g.ID
}
