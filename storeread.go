package runstate

import (
	"context"
	"errors"
	"fmt"
)

// The readers of a run in any Store: what Inspect, NextSteps, ReadLedger
// and Verify do for a run directory, for a Store another module
// implements (pgstore). They read through Store.Read alone: no session,
// no lock, nothing written, so they work on a Store no session has opened
// and while writers are active.

// loadStore replays every record of s into a new state, checking the
// whole chain. torn is the size of a torn last line that was ignored.
func loadStore(ctx context.Context, s Store) (st *state, torn int64, err error) {
	st = newState()
	p := replayer{path: s.String(), c: &st.pos, apply: st.replay}
	torn, err = s.Read(ctx, Position{}, p.line)
	if err != nil {
		return nil, 0, err
	}
	return st, torn, nil
}

// InspectStore is Inspect for the run that s holds: its state as it
// stands, read without a lock; a torn last line is ignored and reported
// in Status.Torn. It fails with a *CorruptError for damaged records and
// ErrVersion for an unknown format. Safe for concurrent use, also while
// other sessions append.
func InspectStore(ctx context.Context, s Store) (*Status, error) {
	st, torn, err := loadStore(ctx, s)
	if err != nil {
		return nil, err
	}
	if st.pos.seq == 0 {
		return nil, fmt.Errorf("runstate: %s holds no record: the run was never created (open it with Options.Request to create it)", s)
	}
	status := st.status(s.String())
	status.Torn = torn
	return status, nil
}

// NextStepsStore is NextSteps for the run that s holds: the handoff text,
// rendered in memory from its records as they stand; dir is the run's
// directory as the text's commands should name it. It takes no lock and
// writes nothing. Safe for concurrent use.
func NextStepsStore(ctx context.Context, s Store, dir string) (string, error) {
	st, _, err := loadStore(ctx, s)
	if err != nil {
		return "", err
	}
	if st.pos.seq == 0 {
		return "", fmt.Errorf("runstate: %s holds no record: the run was never created", s)
	}
	return st.nextSteps(dirArg(dir)), nil
}

// ReadStore is ReadLedger for the run that s holds: fn gets each record in
// order, the whole chain checked as it goes; a torn last line is not
// passed. Damage stops the read with a *CorruptError after fn saw every
// record before it; an error from fn stops it and is returned. It takes
// no lock and writes nothing; safe for concurrent use.
func ReadStore(ctx context.Context, s Store, fn func(*Record) error) error {
	var c chain
	p := replayer{path: s.String(), c: &c, apply: func(rec *Record, _ []byte) error {
		rc := *rec // the replayer reuses rec; fn may keep it
		return fn(&rc)
	}}
	_, err := s.Read(ctx, Position{}, p.line)
	return err
}

// VerifyStore is Verify for the run that s holds: every record (seq, hash
// chain, crc, a torn tail), the store's own checks when it is a Verifier,
// and, when dir is not empty, every artifact against its recorded hash in
// the local directory dir. It takes no lock and writes nothing; safe for
// concurrent use. The error is non-nil only when the records cannot be
// read at all or are in an unknown format (ErrVersion); what is wrong is
// in Report.Problems.
func VerifyStore(ctx context.Context, s Store, dir string) (*Report, error) {
	if ds, ok := s.(*dirStore); ok {
		return Verify(ds.dir)
	}
	rep := &Report{Dir: dir, Problems: []Problem{}}
	st := newState()
	p := replayer{path: s.String(), c: &st.pos, apply: st.replay}
	torn, err := s.Read(ctx, Position{}, p.line)
	rep.Records, rep.Bytes = st.pos.seq, st.pos.offset
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		rep.Problems = append(rep.Problems, Problem{File: ce.Path, Line: ce.Line, Offset: ce.Offset, What: ce.Err.Error(),
			Fix: "the records cannot be trusted from here on: restore them from a backup"})
		return rep, nil
	case err != nil:
		return nil, err
	}
	if torn > 0 {
		rep.Problems = append(rep.Problems, tornProblem(s.String(), st.pos.seq+1, st.pos.offset, torn))
	}
	if v, ok := s.(Verifier); ok {
		probs, err := v.VerifyStore(ctx)
		if err != nil {
			return nil, err
		}
		rep.Problems = append(rep.Problems, probs...)
	}
	if st.pos.seq == 0 {
		rep.Problems = append(rep.Problems, Problem{File: s.String(), What: "no record: the run was never created",
			Fix: "open it with Options.Request to create the run"})
		return rep, nil
	}
	if dir != "" {
		probs, err := checkArtifacts(dir, st)
		if err != nil {
			return nil, err
		}
		rep.Problems = append(rep.Problems, probs...)
	}
	return rep, nil
}
