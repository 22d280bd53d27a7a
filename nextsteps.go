package runstate

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runstate/runstate/internal/escape"
)

// nextStepsFile is the handoff, relative to the run directory.
const nextStepsFile = "logs/next-steps.txt"

// place is where the handoff says the run is: addr, the run as its
// commands take it (runAddress: a run directory, or a store's address;
// "" for a store no command reads), and cmd, as they name it (dirArg); look,
// the "look at:" lines of a store that names its own places (Addresser),
// escaped; nil for a run directory, whose files the page names; cmds: the
// page ends with "runstate status CMD; runstate log CMD".
type place struct {
	addr string
	cmd  string
	look []string
	cmds bool
}

// command is how a person does verb to target (a stage or an effect key)
// of the run at p, for a blocker's Action and an error's advice: "runstate
// VERB ADDR TARGET ARGS" on the run's address (p.cmd: the directory or the
// store's Address, quoted for a shell, as target is), or, for a store that
// no runstate command reads (Addresser with Address ""), the call of the
// Run's method (call: its arguments after ctx, with %s for the target,
// quoted as a Go string) in the program that holds the run.
func (p place) command(verb, target, args, call string) string {
	if !p.cmds {
		return "call Run." + strings.Replace(call, "%s", strconv.Quote(target), 1) + " in the program that holds the run (no runstate command reads its store)"
	}
	return "runstate " + verb + " " + p.cmd + " " + escape.Arg(target) + " " + args
}

// approve, invalidate and resolve are the commands that clear an awaiting
// stage, a fatal one and an effect whose outcome is unknown (command);
// args are resolve's flags.
func (p place) approve(stage string) string {
	return p.command("approve", stage, "-by NAME -note TEXT", "Approve(ctx, %s, NAME, TEXT)")
}

func (p place) invalidate(stage string) string {
	return p.command("invalidate", stage, "-reason TEXT", "Invalidate(ctx, %s, TEXT)")
}

func (p place) resolve(key, args string) string {
	return p.command("resolve", key, args,
		"Resolve(ctx, %s, runstate.Resolution{Sent: true, Receipt: RECEIPT, By: NAME}) (or Sent: false)")
}

// placeOf is where the handoff of the run in s says it is: a run
// directory dir, unless s is an Addresser.
func placeOf(s Store, dir string) place {
	a, ok := s.(Addresser)
	if !ok {
		return place{addr: runAddress(dir), cmd: dirArg(dir), cmds: true}
	}
	p := place{cmd: dirArg(dir), look: []string{}}
	if addr := a.Address(); addr != "" {
		p.addr, p.cmd, p.cmds = runAddress(addr), dirArg(addr), true
	}
	for _, line := range a.LookAt() {
		p.look = append(p.look, oneLine(line))
	}
	return p
}

// nextSteps renders the handoff of a run directory (nextStepsIn), whose
// commands name it as dir (dirArg).
func (s *state) nextSteps(dir string) string {
	return s.nextStepsIn(place{cmd: dir, cmds: true})
}

// nextStepsIn renders the handoff: one short page that a person or a
// fresh agent can act on in ten seconds. Its first line names the ledger
// seq it reflects, so a reader can tell whether it is behind. at says
// where the run is: its commands name at.cmd, its "look at:" lines are a
// run directory's files or the store's own. Every text from the ledger is
// escaped (escape.Text): the page holds no control character but its
// line breaks.
func (s *state) nextStepsIn(at place) string {
	dir := at.cmd
	var b strings.Builder
	b.Grow(1024)
	fmt.Fprintf(&b, "runstate handoff: run %s, as of ledger seq %d (%s)\n", escape.Text(s.identity.ID), s.pos.seq, s.lastAt().Format(time.RFC3339))
	fmt.Fprintf(&b, "request:  %s\n", oneLine(s.identity.Request))
	if s.revision != "" {
		fmt.Fprintf(&b, "revision: %s\n", escape.Text(s.revision))
	}
	if len(s.env) > 0 {
		keys := make([]string, 0, len(s.env))
		for k := range s.env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, escape.Text(k)+"="+escape.Text(s.env[k]))
		}
		fmt.Fprintf(&b, "env:      %s\n", strings.Join(kv, " "))
	}
	b.WriteString("\n")

	doneNames, next, rest := s.planSummary()
	remaining := rest.n
	if next != "" {
		remaining++
	}
	fmt.Fprintf(&b, "progress: %d of %d planned stages done", doneNames.n, doneNames.n+remaining)
	if doneNames.n > 0 {
		fmt.Fprintf(&b, " (%s)", doneNames)
	}
	b.WriteString("\n")

	if last := s.stages[s.lastDone]; last != nil {
		switch last.State {
		case StateComplete:
			fmt.Fprintf(&b, "last:     %s complete (attempt %d, seq %d)\n", escape.Text(last.Name), last.Attempt, last.DoneSeq)
			for i, o := range last.Outputs {
				if i == 5 {
					fmt.Fprintf(&b, "          ... and %d more outputs (manifest.json)\n", len(last.Outputs)-i)
					break
				}
				fmt.Fprintf(&b, "          -> %s (sha256:%.12s, %d bytes)\n", escape.Text(o.Path), escape.Text(o.SHA256), o.Size)
			}
		case StateSkipped:
			fmt.Fprintf(&b, "last:     %s skipped: %s\n", escape.Text(last.Name), oneLine(last.Reason))
		}
	}

	switch {
	case next != "":
		fmt.Fprintf(&b, "next:     %s (%s)\n", escape.Text(next), describe(s.stages[next]))
	case len(s.plan) == 0:
		b.WriteString("next:     nothing planned yet: the pipeline calls Plan first\n")
	default:
		b.WriteString("next:     nothing: every planned stage is done\n")
	}
	if rest.n > 0 {
		fmt.Fprintf(&b, "then:     %s\n", rest)
	}
	if n := len(s.dropped); n > 0 {
		dropped := shortList{names: s.dropped[:min(n, shortListMax)], n: n}
		fmt.Fprintf(&b, "dropped:  %s (planned once, no longer: not counted)\n", dropped)
	}

	b.WriteString("\n")
	var blockers []Blocker
	if s.blocking > 0 {
		blockers = s.blockers(at)
	}
	if len(blockers) == 0 {
		b.WriteString("blockers: none\n")
	} else {
		fmt.Fprintf(&b, "blockers: %d\n", len(blockers))
		for i, bl := range blockers {
			if i == 10 {
				more := "runstate status " + dir
				if !at.cmds {
					more = "Run.Status"
				}
				fmt.Fprintf(&b, "  ... and %d more: %s\n", len(blockers)-i, more)
				break
			}
			what := escape.Text(bl.Stage)
			if what == "" {
				what = "effect " + escape.Text(bl.Key)
			}
			fmt.Fprintf(&b, "  - %s %s: %s\n    do: %s\n", what, bl.Kind, oneLine(bl.Reason), bl.Action)
		}
	}
	b.WriteString("\n")
	lead := "look at:  "
	if at.look == nil { // a run directory
		b.WriteString("look at:  logs/ledger.jsonl (the source of truth, one JSON record a line)\n")
		b.WriteString("          manifest.json (stages, artifacts with hashes, effects)\n")
		lead = "          "
	}
	for _, line := range at.look {
		b.WriteString(lead)
		b.WriteString(line)
		b.WriteString("\n")
		lead = "          "
	}
	if at.cmds {
		for _, part := range []string{lead, "runstate status ", dir, "; runstate log ", dir, "\n"} {
			b.WriteString(part) // no Fprintf: boxing dir would allocate on every append
		}
	}
	return b.String()
}

// dirArg is the run directory as the handoff's commands name it: the
// absolute path, quoted for a shell where it needs it (escape.Arg). A
// store's address (postgres://...) is named as it is.
func dirArg(dir string) string { return escape.Arg(runAddress(dir)) }

// runAddress is the run at dir as a command takes it: a directory by its
// absolute path, a store's address (postgres://...) as it is.
func runAddress(dir string) string {
	if strings.Contains(dir, "://") {
		return dir
	}
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// planSummary returns what the handoff shows of the plan: the stages
// done, the next one to do and the rest. This runs after every append:
// it reads the plan index (planIndex), keeping only the names the page
// shows, and never copies the state (Status does).
func (s *state) planSummary() (doneNames shortList, next string, rest shortList) {
	if s.planned.dup {
		for _, name := range s.plan {
			switch {
			case done(s.stages[name].State):
				doneNames.add(name)
			case next == "":
				next = name
			default:
				rest.add(name)
			}
		}
		return doneNames, next, rest
	}
	open := s.planned.remaining()
	doneNames.n = len(s.plan) - open
	s.planned.each(false, func(i int) bool {
		doneNames.names = append(doneNames.names, s.plan[i])
		return len(doneNames.names) < shortListMax
	})
	if open > 0 {
		rest.n = open - 1
		s.planned.each(true, func(i int) bool {
			if next == "" {
				next = s.plan[i]
				return rest.n > 0
			}
			rest.names = append(rest.names, s.plan[i])
			return len(rest.names) < shortListMax
		})
	}
	return doneNames, next, rest
}

// shortList is a list of stage names as the handoff shows it: the first
// eight, then how many more, without keeping the rest.
type shortList struct {
	names []string
	n     int
}

const shortListMax = 8

func (l *shortList) add(name string) {
	if len(l.names) < shortListMax {
		l.names = append(l.names, name)
	}
	l.n++
}

func (l shortList) String() string {
	names, cloned := l.names, false
	for i, n := range l.names {
		if e := escape.Text(n); e != n {
			if !cloned {
				names, cloned = slices.Clone(l.names), true
			}
			names[i] = e
		}
	}
	if l.n <= shortListMax {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, ... (%d more)", strings.Join(names, ", "), l.n-shortListMax)
}

// describe says in a few words where a stage stands.
func describe(st *StageStatus) string {
	switch st.State {
	case StatePending:
		if st.Attempt == 0 {
			return "not started"
		}
		if st.Reason != "" {
			return fmt.Sprintf("to redo: %s", oneLine(st.Reason))
		}
		return "pending"
	case StateRunning:
		return fmt.Sprintf("running, attempt %d", st.Attempt)
	case StateFailed:
		switch st.Reason {
		case diskFullReason:
			return fmt.Sprintf("failed on a full disk, not counted toward MaxAttempts; free space, then run the pipeline again: %s", oneLine(st.Error))
		case canceledReason:
			return fmt.Sprintf("canceled by its caller, not counted toward MaxAttempts; run the pipeline again: %s", oneLine(st.Error))
		}
		return fmt.Sprintf("failed %d time(s), will retry: %s", st.Failures, oneLine(st.Error))
	case StateInterrupted:
		return fmt.Sprintf("attempt %d was interrupted; begin it again", st.Attempt)
	case StateAwaiting:
		return "awaiting a person"
	case StateFatal:
		return "failed fatally"
	}
	return st.State
}

// lastAt is the time of the latest record about a stage (the run's
// creation before there is one).
func (s *state) lastAt() time.Time {
	t := s.stageAt
	if t.IsZero() {
		t = s.created
	}
	return t.UTC()
}

// oneLine folds s to one line (runs of white space, line breaks included,
// become one space), cuts it at 200 bytes on a rune boundary, and escapes
// what is left (escape.Text).
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		cut := 197
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return escape.Text(s)
}
