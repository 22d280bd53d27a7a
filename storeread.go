package runstate

import (
	"context"
	"errors"
)

// The readers of a run in any Store: Inspect, NextSteps, ReadLedger and
// Verify for a run directory (the file store), InspectStore, NextStepsStore,
// ReadStore and VerifyStore for a Store another module implements
// (pgstore). They read through the store alone: no session, no lock,
// nothing written, so they work on a Store no session has opened and while
// writers are active. Every record is checked (seq, chain, crc) and applied
// once, by the replayer.

// checkedReader is a store that checks and applies records itself, on the
// replayer's functions, sparing the copy of each line through Read (the
// file store: its journal stands in for lost bytes as it reads).
type checkedReader interface {
	readChecked(c *chain, apply func(*Record, []byte) error) (torn int64, err error)
}

// readRecords applies every record after c to apply, c advanced past the
// last; torn is the size of a torn last line that was ignored.
func readRecords(ctx context.Context, s Store, c *chain, apply func(*Record, []byte) error) (torn int64, err error) {
	if cr, ok := s.(checkedReader); ok {
		return cr.readChecked(c, apply)
	}
	p := replayer{path: s.String(), c: c, apply: apply}
	torn, err = s.Read(ctx, c.position(0), p.line)
	return torn, corruptIn(s, err)
}

// loadStore reads the state of the run in s. The file store starts from
// its snapshot (readState); any other store's records are replayed.
func loadStore(ctx context.Context, s Store) (*state, int64, error) {
	if ds, ok := s.(*dirStore); ok {
		return ds.readState()
	}
	st := newState()
	torn, err := readRecords(ctx, s, &st.pos, st.replay)
	if err != nil {
		return nil, 0, err
	}
	if st.pos.seq == 0 {
		return nil, 0, errNoRun(s)
	}
	return st, torn, nil
}

// inspect is Inspect and InspectStore; dir names the run in the Status.
func inspect(ctx context.Context, s Store, dir string) (*Status, error) {
	st, torn, err := loadStore(ctx, s)
	if err != nil {
		return nil, err
	}
	status := st.status(dir, placeOf(s, dir))
	status.Torn = torn
	return status, nil
}

// InspectStore is Inspect for the run that s holds: its state as it
// stands, read without a lock; a torn last line is ignored and reported
// in Status.Torn. It writes nothing: for the file store, no repair of a
// torn tail or of records only the journal holds, and no file or
// directory created, not even a lock file. It fails with a *CorruptError
// for damaged records, ErrVersion for an unknown format, and an error
// that matches fs.ErrNotExist (errors.Is) when s holds no record. Safe
// for concurrent use, also while other sessions append.
func InspectStore(ctx context.Context, s Store) (*Status, error) {
	dir := s.String()
	if ds, ok := s.(*dirStore); ok {
		dir = ds.dir
	}
	return inspect(ctx, s, dir)
}

// NextStepsStore is NextSteps for the run that s holds: the handoff text,
// rendered in memory from its records as they stand; dir is the run's
// directory as the text's commands should name it, unless s is an
// Addresser (then they name its Address, and the page's "look at:" lines
// are its own, as in the handoff its sessions publish). It takes no lock
// and writes nothing. Safe for concurrent use.
func NextStepsStore(ctx context.Context, s Store, dir string) (string, error) {
	st, _, err := loadStore(ctx, s)
	if err != nil {
		return "", err
	}
	return st.nextStepsIn(placeOf(s, dir)), nil
}

// ReadStore is ReadLedger for the run that s holds: fn gets each record in
// order, the whole chain checked as it goes; a torn last line is not
// passed. Damage stops the read with a *CorruptError after fn saw every
// record before it; an error from fn stops it and is returned. It takes
// no lock and writes nothing; safe for concurrent use.
func ReadStore(ctx context.Context, s Store, fn func(*Record) error) error {
	var c chain
	_, err := readRecords(ctx, s, &c, func(rec *Record, _ []byte) error {
		rc := *rec // the replayer reuses rec; fn may keep it
		return fn(&rc)
	})
	return err
}

// VerifyStore is Verify for the run that s holds: every record (seq, hash
// chain, crc, a torn tail), the store's own checks (the file store's
// journal and projections; a Verifier's), and, when dir is not empty,
// every artifact against its recorded hash in the local directory dir.
// It takes no lock and writes nothing; safe for concurrent use. The error
// is non-nil only when the records cannot be read at all or are in an
// unknown format (ErrVersion); what is wrong is in Report.Problems.
func VerifyStore(ctx context.Context, s Store, dir string) (*Report, error) {
	rep := &Report{Dir: dir, Address: placeOf(s, dir).addr, Problems: []Problem{}}
	st := newState()
	var settled int64 // the last record that is not a begin: the handoff lags begins (handoffLag)
	each := func(rec *Record, line []byte) error {
		_ = st.replay(rec, line)
		if rec.Ev != evBegin {
			settled = rec.Seq
		}
		return nil
	}
	ds, file := s.(*dirStore)
	if file {
		done, err := ds.verifyLedger(rep, st, each)
		if err != nil {
			return nil, err
		}
		if done {
			return rep, nil
		}
	} else {
		done, err := verifyRecords(ctx, s, rep, st, each)
		if err != nil {
			return nil, err
		}
		if done {
			return rep, nil
		}
	}
	if dir != "" {
		probs, err := checkArtifacts(dir, st, placeOf(s, dir))
		if err != nil {
			return nil, err
		}
		rep.Problems = append(rep.Problems, probs...)
	}
	if file {
		ds.verifyProjections(rep, st, settled)
	}
	return rep, nil
}

// verifyRecords is VerifyStore's check of the records of a store other
// than the file store, and of its own (Verifier). done: nothing more to
// check.
func verifyRecords(ctx context.Context, s Store, rep *Report, st *state, each func(*Record, []byte) error) (done bool, err error) {
	torn, err := readRecords(ctx, s, &st.pos, each)
	rep.Records, rep.Bytes = st.pos.seq, st.pos.offset
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		rep.Problems = append(rep.Problems, Problem{File: ce.Path, Line: ce.Line, Offset: ce.Offset, What: ce.Err.Error(),
			Fix: "the records cannot be trusted from here on: restore them from a backup"})
		return true, nil
	case err != nil:
		return false, err
	}
	if torn > 0 {
		rep.Problems = append(rep.Problems, tornProblem(s.String(), st.pos.seq+1, st.pos.offset, torn,
			"the next writer cuts it (and keeps it aside where the store can)"))
	}
	if v, ok := s.(Verifier); ok {
		probs, err := v.VerifyStore(ctx)
		if err != nil {
			return false, err
		}
		rep.Problems = append(rep.Problems, probs...)
	}
	if st.pos.seq == 0 {
		rep.Problems = append(rep.Problems, Problem{File: s.String(), What: "no record: the run was never created",
			Fix: "open it with Options.Request to create the run"})
		return true, nil
	}
	return false, nil
}
