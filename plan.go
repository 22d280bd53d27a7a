package runstate

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// The plan is made of parts: the run's own (Run.Plan, a plan record with
// no stage) and, for each stage that called Stage.Plan, the stages it
// discovered (a plan record naming that stage, written in the same batch
// as its complete). The plan that Status and the handoff show is the
// run's part with each stage's part placed right after that stage:
//
//	Run.Plan:             inspect, plan, verify
//	plan's Stage.Plan:    execute/a, execute/b
//	the plan:             inspect, plan, execute/a, execute/b, verify
//
// The part of a stage that is not in the plan itself comes at the end (in
// the order of the stages' names). A stage named twice counts where it
// comes first. A stage that was planned and no longer is (its planner
// was redone and did not name it again, or Run.Plan dropped it) is
// dropped: it keeps its state and outputs, StageStatus.Dropped is set, and
// it counts neither as done nor as remaining.

// replan applies a plan record: names are the run's part (by "") or the
// part of stage by.
func (s *state) replan(by string, names []string) {
	if by == "" {
		s.top = names
	} else if len(names) == 0 {
		delete(s.sub, by)
	} else {
		if s.sub == nil {
			s.sub = map[string][]string{}
		}
		s.sub[by] = names
	}
	s.setPlan(s.expandPlan())
}

// expandPlan places each stage's part of the plan after that stage.
func (s *state) expandPlan() []string {
	if len(s.sub) == 0 {
		return s.top // as recorded, the way a plan was before Stage.Plan
	}
	out := make([]string, 0, len(s.top)+len(s.sub))
	seen := make(map[string]bool, len(s.top))
	var stack []string
	// add appends name and, depth first, the parts of the stages it
	// brings in. Iterative: a ledger edited by hand may nest deeply.
	add := func(names []string) {
		for i := len(names) - 1; i >= 0; i-- {
			stack = append(stack, names[i])
		}
		for len(stack) > 0 {
			n := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[n] {
				continue
			}
			seen[n] = true
			out = append(out, n)
			part := s.sub[n]
			for i := len(part) - 1; i >= 0; i-- {
				stack = append(stack, part[i])
			}
		}
	}
	add(s.top)
	for _, by := range slices.Sorted(maps.Keys(s.sub)) {
		if !seen[by] {
			add(s.sub[by])
		}
	}
	return out
}

// setPlan makes plan the plan, marking the stages that leave it dropped
// and those in it not dropped. It costs O(plan), like the plan record.
func (s *state) setPlan(plan []string) {
	in := make(map[string]bool, len(plan))
	changed := false
	for _, n := range plan {
		in[n] = true
		if st := s.stage(n); st.Dropped {
			st.Dropped, changed = false, true
		}
	}
	for _, n := range s.plan {
		if st := s.stage(n); !in[n] && !st.Dropped {
			st.Dropped, changed = true, true
			s.dropped = append(s.dropped, n)
		}
	}
	s.plan = plan
	s.planned.build(s)
	if changed {
		s.dropped = slices.DeleteFunc(s.dropped, func(n string) bool { return !s.stages[n].Dropped })
		slices.Sort(s.dropped)
		s.dropped = slices.Compact(s.dropped)
	}
}

// listDropped lists the dropped stages for the handoff, which is rendered
// after every append and so must not look at every stage: for a state
// read from manifest.json (setPlan keeps the list up to date).
func (s *state) listDropped() {
	s.dropped = s.dropped[:0]
	for n, st := range s.stages {
		if st.Dropped {
			s.dropped = append(s.dropped, n)
		}
	}
	slices.Sort(s.dropped)
}

// checkPlan refuses a list of stages that Plan could not record: a bad
// name, or one named twice.
func checkPlan(stages []string) error {
	seen := make(map[string]bool, len(stages))
	for _, n := range stages {
		if err := checkName(n); err != nil {
			return err
		}
		if seen[n] {
			return fmt.Errorf("%w: stage %q planned twice", ErrInvalid, n)
		}
		seen[n] = true
	}
	return nil
}

// Plan declares the stages this attempt discovered, in order: the stages
// a plan stage found to do. They are recorded with the attempt's Complete
// (or Await), in the same batch, before the complete record: when
// Complete returns, both are durable, and no crash leaves the stage
// complete without its plan. Until then Plan writes nothing, and if the
// attempt does not complete (Fail, ErrStale, a crash), its plan is not
// recorded.
//
// The stages are placed in the run's plan right after this stage (see
// Run.Plan), so Status and logs/next-steps.txt count them and name the
// next one. Calling Plan again in the same attempt replaces the list.
// When the stage is redone, what the new attempt declares replaces what
// the last one did: the stages it no longer names are dropped (Status
// marks them StageStatus.Dropped, the handoff lists them as dropped; a
// done one keeps its state and outputs, but counts neither as done nor
// as remaining). An attempt that does not call Plan leaves the stage's
// plan as it was; Plan() with no names empties it.
//
// Plan fails with ErrInvalid for a bad stage name, a name given twice or
// the stage's own name, and with ErrClosed after the attempt ended. Safe
// for concurrent use.
func (st *Stage) Plan(names ...string) error {
	if err := checkPlan(names); err != nil {
		return err
	}
	if slices.Contains(names, st.name) {
		return fmt.Errorf("%w: stage %s cannot plan itself", ErrInvalid, st.name)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.check(); err != nil {
		return err
	}
	st.plan = slices.Clone(names)
	if st.plan == nil {
		st.plan = []string{}
	}
	return nil
}

// planRecords returns the plan record that this attempt's end writes
// first: none when it did not call Plan, or declared the part of the plan
// it already has. The caller holds st.mu; s is the committer's state.
func (st *Stage) planRecords(s *state) []*Record {
	if st.plan == nil || slices.Equal(s.sub[st.name], st.plan) {
		return nil
	}
	data, _ := json.Marshal(st.plan)
	return []*Record{{Ev: evPlan, Stage: st.name, Attempt: st.attempt, Data: data}}
}
