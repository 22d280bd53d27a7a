package runstate

// undo keeps what apply changes while it is on (state.u), so that the
// records of an optimistic batch that lost its bet (ErrConflict) can be
// taken back in memory instead of rebuilding the state from every record
// of the store (rollBack, which remains the fallback). apply changes the
// state's own fields, and in its maps only the entries of the record's
// stage, effect and sessions, and in the plan index only the stage's bit:
// undo saves each of those before the record (restored in reverse order,
// so that the first save of an entry is the one that stays). A record
// that changes more (create, plan, an interrupted record for a session
// between stages) makes it broken: take reports false and the caller
// reads. The committer keeps one, reused from batch to batch (no
// allocation once its lists have grown). Guarded by stMu, as the state.
type undo struct {
	broken   bool
	top      state // the state's fields before the batch (the same maps)
	stages   []saved[StageStatus]
	effects  []saved[EffectStatus]
	sessions []saved[SessionStatus]
	bits     []savedBit
}

// saved is a map entry as it was: p nil, none.
type saved[T any] struct {
	key string
	p   *T
	old T
}

type savedBit struct {
	word int
	old  uint64
}

// keep appends m's entry for key, as it is now, to list.
func keep[T any](list []saved[T], m map[string]*T, key string) []saved[T] {
	sv := saved[T]{key: key, p: m[key]}
	if sv.p != nil {
		sv.old = *sv.p
	}
	return append(list, sv)
}

// restore puts the entries of list back in m, the last kept first, so
// that an entry kept twice ends as it was kept first.
func restore[T any](list []saved[T], m map[string]*T) {
	for i := len(list) - 1; i >= 0; i-- {
		sv := &list[i]
		if sv.p == nil {
			delete(m, sv.key)
			continue
		}
		*sv.p = sv.old
		m[sv.key] = sv.p
	}
}

// startUndo turns u on for s: from now on apply saves what it changes.
func (s *state) startUndo(u *undo) {
	u.broken = false
	u.stages, u.effects, u.sessions, u.bits = u.stages[:0], u.effects[:0], u.sessions[:0], u.bits[:0]
	u.top = *s
	u.top.u = nil
	s.u = u
}

// stopUndo turns s's undo off (the batch is the run's, or taken back).
func (s *state) stopUndo() { s.u = nil }

// save keeps what apply(r) is about to change.
func (u *undo) save(s *state, r *Record) {
	switch r.Ev {
	case evCreate, evPlan:
		u.broken = true
		return
	case evInterrupted:
		if r.Stage == "" {
			u.broken = true // it names its session in its data
			return
		}
		if st := s.stages[r.Stage]; st != nil {
			u.sessions = keep(u.sessions, s.sessions, st.Session) // apply deletes the stage's session
		}
	}
	if r.Session != "" {
		u.sessions = keep(u.sessions, s.sessions, r.Session)
	}
	if r.Stage != "" || stageEvent(r.Ev) {
		u.stages = keep(u.stages, s.stages, r.Stage)
		if i, ok := s.planned.at[r.Stage]; ok && !s.planned.dup {
			u.bits = append(u.bits, savedBit{word: i / 64, old: s.planned.open[i/64]})
		}
	}
	if r.Key != "" || effectEvent(r.Ev) {
		u.effects = keep(u.effects, s.effects, r.Key)
	}
}

// stageEvent reports whether apply looks up (and so may create) the
// record's stage for ev, whatever its name.
func stageEvent(ev string) bool {
	switch ev {
	case evBegin, evComplete, evSkip, evFail, evAwait, evApprove, evInterrupted, evInvalidate:
		return true
	}
	return false
}

// effectEvent is stageEvent for the record's effect.
func effectEvent(ev string) bool {
	switch ev {
	case evIntent, evConfirm, evUnconfirmed, evResolve:
		return true
	}
	return false
}

// take restores s as it was at startUndo and turns the undo off; false
// (s unchanged since the last record, the undo off) when a record was
// one it cannot take back: the caller rebuilds the state (rollBack).
func (s *state) take(u *undo) bool {
	s.u = nil
	if u.broken {
		return false
	}
	for i := len(u.bits) - 1; i >= 0; i-- {
		s.planned.open[u.bits[i].word] = u.bits[i].old
	}
	restore(u.stages, s.stages)
	restore(u.effects, s.effects)
	restore(u.sessions, s.sessions)
	*s = u.top
	return true
}
