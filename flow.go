package runstate

import (
	"fmt"
	"slices"
	"strings"
)

// Flow names the transitions allowed between stages: which stages may
// start a run and which may follow each stage. A stage name is matched by
// its first segment, so "execute/file-3" follows the flow of "execute".
// Repeating a stage (a retry, or another "execute/..." sub-stage) and
// redoing a stage the run already reached (after an invalidation) are
// always allowed. A Flow is read-only once passed to Open.
type Flow struct {
	// Start lists the stages a run may begin with. Empty allows any.
	Start []string
	// Next maps a stage to the stages that may follow it once it is done.
	Next map[string][]string
}

// check refuses a Flow that names a stage no Begin could be given (an
// empty name, a control character: CheckName), before the run opens:
// such a Flow let no stage begin, each Begin saying the run "starts
// with" a name that could not be read. A nil Flow is no Flow.
func (f *Flow) check() error {
	if f == nil {
		return nil
	}
	for _, s := range f.Start {
		if err := CheckName("stage name in Options.Flow.Start", s); err != nil {
			return err
		}
	}
	for from, next := range f.Next {
		if err := CheckName("stage name in Options.Flow.Next", from); err != nil {
			return err
		}
		for _, s := range next {
			if err := CheckName(fmt.Sprintf("stage name in Options.Flow.Next[%q]", from), s); err != nil {
				return err
			}
		}
	}
	return nil
}

// AgentFlow returns the flow of a coding agent: inspect → plan → execute →
// verify → await-review → complete, where verify may send the run back to
// execute or plan. It returns a new Flow each call, so it is safe for
// concurrent use, and so is the Flow while no one changes it.
func AgentFlow() *Flow {
	return &Flow{
		Start: []string{"inspect"},
		Next: map[string][]string{
			"inspect":      {"plan"},
			"plan":         {"execute"},
			"execute":      {"verify"},
			"verify":       {"await-review", "execute", "plan"},
			"await-review": {"complete"},
		},
	}
}

// checkFlow refuses to begin name when the run's Flow does not allow it
// after the last stage that was done.
func (r *Run) checkFlow(s *state, name string, st *StageStatus) error {
	f := r.opts.Flow
	if f == nil || st.Attempt > 0 {
		return nil
	}
	to := segment(name)
	if s.lastDone == "" {
		if len(f.Start) == 0 || slices.Contains(f.Start, to) {
			return nil
		}
		return fmt.Errorf("%w: %s cannot start the run; it starts with %s", ErrTransition, name, strings.Join(f.Start, " or "))
	}
	from := segment(s.lastDone)
	if from == to || slices.Contains(f.Next[from], to) {
		return nil
	}
	if reached(s, to) {
		return nil // the run reached it before
	}
	allowed := f.Next[from]
	if len(allowed) == 0 {
		return fmt.Errorf("%w: %s cannot follow %s, which ends the flow", ErrTransition, name, s.lastDone)
	}
	return fmt.Errorf("%w: %s cannot follow %s; allowed next: %s", ErrTransition, name, s.lastDone, strings.Join(allowed, ", "))
}

// reached reports whether the run ever began a stage of segment seg: seg
// itself or one of its sub-stages ("execute/file-3" for "execute"). It is
// called only on the way to refusing a transition, so the scan is cheap
// where it matters.
func reached(s *state, seg string) bool {
	if st := s.stages[seg]; st != nil && st.Attempt > 0 {
		return true
	}
	for name, st := range s.stages {
		if st.Attempt > 0 && strings.HasPrefix(name, seg+"/") {
			return true
		}
	}
	return false
}
