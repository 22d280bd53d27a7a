package runstate

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// nextStepsFile is the handoff, relative to the run directory.
const nextStepsFile = "logs/next-steps.txt"

// nextSteps renders the handoff: one short page that a person or a fresh
// agent can act on in ten seconds. Its first line names the ledger seq it
// reflects, so a reader can tell whether it is behind.
func (s *state) nextSteps() string {
	var b strings.Builder
	st := s.status("")
	fmt.Fprintf(&b, "runstate handoff: run %s, as of ledger seq %d (%s)\n", s.identity.ID, s.pos.seq, s.lastAt().Format(time.RFC3339))
	fmt.Fprintf(&b, "request:  %s\n", oneLine(s.identity.Request))
	if s.revision != "" {
		fmt.Fprintf(&b, "revision: %s\n", s.revision)
	}
	if len(s.env) > 0 {
		keys := make([]string, 0, len(s.env))
		for k := range s.env {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, k+"="+s.env[k])
		}
		fmt.Fprintf(&b, "env:      %s\n", strings.Join(kv, " "))
	}
	b.WriteString("\n")

	fmt.Fprintf(&b, "progress: %d of %d planned stages done", st.Done, st.Done+st.Remaining)
	var doneNames []string
	for _, name := range s.plan {
		if done(s.stages[name].State) {
			doneNames = append(doneNames, name)
		}
	}
	if len(doneNames) > 0 {
		fmt.Fprintf(&b, " (%s)", abbreviate(doneNames, 8))
	}
	b.WriteString("\n")

	if last := s.stages[s.lastDone]; last != nil {
		switch last.State {
		case StateComplete:
			fmt.Fprintf(&b, "last:     %s complete (attempt %d, seq %d)\n", last.Name, last.Attempt, last.DoneSeq)
			for i, o := range last.Outputs {
				if i == 5 {
					fmt.Fprintf(&b, "          ... and %d more outputs (manifest.json)\n", len(last.Outputs)-i)
					break
				}
				fmt.Fprintf(&b, "          -> %s (sha256:%.12s, %d bytes)\n", o.Path, o.SHA256, o.Size)
			}
		case StateSkipped:
			fmt.Fprintf(&b, "last:     %s skipped: %s\n", last.Name, oneLine(last.Reason))
		}
	}

	switch {
	case st.Next != "":
		next := s.stages[st.Next]
		fmt.Fprintf(&b, "next:     %s (%s)\n", st.Next, describe(next))
	case len(s.plan) == 0:
		b.WriteString("next:     nothing planned yet: the pipeline calls Plan first\n")
	default:
		b.WriteString("next:     nothing: every planned stage is done\n")
	}
	if st.Remaining > 1 {
		var rest []string
		for _, name := range s.plan {
			if !done(s.stages[name].State) && name != st.Next {
				rest = append(rest, name)
			}
		}
		fmt.Fprintf(&b, "then:     %s\n", abbreviate(rest, 8))
	}

	b.WriteString("\n")
	if len(st.Blockers) == 0 {
		b.WriteString("blockers: none\n")
	} else {
		fmt.Fprintf(&b, "blockers: %d\n", len(st.Blockers))
		for i, bl := range st.Blockers {
			if i == 10 {
				fmt.Fprintf(&b, "  ... and %d more: runstate status DIR\n", len(st.Blockers)-i)
				break
			}
			what := bl.Stage
			if what == "" {
				what = "effect " + bl.Key
			}
			fmt.Fprintf(&b, "  - %s %s: %s\n    do: %s\n", what, bl.Kind, oneLine(bl.Reason), bl.Action)
		}
	}
	b.WriteString("\n")
	b.WriteString("look at:  logs/ledger.jsonl (the source of truth, one JSON record a line)\n")
	b.WriteString("          manifest.json (stages, artifacts with hashes, effects)\n")
	b.WriteString("          runstate status DIR; runstate log DIR\n")
	return b.String()
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

func (s *state) lastAt() time.Time {
	var t time.Time
	for _, st := range s.stages {
		if st.At.After(t) {
			t = st.At
		}
	}
	if t.IsZero() {
		t = s.created
	}
	return t.UTC()
}

func abbreviate(names []string, max int) string {
	if len(names) <= max {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s, ... (%d more)", strings.Join(names[:max], ", "), len(names)-max)
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:197] + "..."
	}
	return s
}
