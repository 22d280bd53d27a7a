package runstate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The file store's readers: what Inspect, ReadLedger and Verify read of a
// run directory, without a lock and without writing, from any process.
// The records that a machine crash left only in logs/ledger.wal stand in
// for the ledger's lost bytes (replayJournal); Verify reports them, the
// journal's own problems and the projections' lag.

// openLedger opens the ledger of the run in dir for reading, without
// blocking on a FIFO; it refuses one that is not a regular file. Its error
// says whether dir is missing or is not a run directory.
func openLedger(fsys fileSystem, dir string) (file, string, error) {
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	f, _, err := openOwn(fsys, dir, ledgerFile, os.O_RDONLY)
	if err == nil {
		return f, lp, nil
	}
	if nr := (*notRegular)(nil); errors.As(err, &nr) {
		return nil, lp, fmt.Errorf("runstate: cannot read the ledger %s: %w: move it away", lp, err)
	}
	if errors.As(err, new(*ownFileError)) {
		return nil, lp, err // names it
	}
	if isNotExist(err) {
		if _, derr := os.Stat(dir); derr != nil {
			return nil, lp, fmt.Errorf("runstate: no run directory at %s: %w", dir, derr)
		}
		return nil, lp, fmt.Errorf("runstate: %s is not a run directory (no %s): %w", dir, ledgerFile, fs.ErrNotExist)
	}
	return nil, lp, fmt.Errorf("runstate: cannot read the ledger: %w", err) // err names the file
}

// readState loads the state of the run without a lock or a write: from
// the snapshot when it holds (Inspect, NextSteps).
func (s *dirStore) readState() (*state, int64, error) {
	f, lp, err := openLedger(s.fs, s.dir)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	// Records a machine crash kept out of the ledger, or damaged in it,
	// are read from the journal (store_file_wal.go).
	st, _, _, err := loadState(s.fs, s.dir, f)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	torn := max(0, fi.Size()-st.pos.offset)
	if st.pos.seq == 0 {
		if found := leftovers(s.fs, s.dir, true); len(found) > 0 {
			return nil, 0, lostLedger(lp, f, true, found)
		}
		return nil, 0, fmt.Errorf("runstate: %s holds no complete record: the run was never created (Open it with Options.Request to create it)", lp)
	}
	return st, torn, nil
}

// readChecked is Read with the records checked and applied once: every
// line after c, through apply, c advanced past the last. torn is the size
// of a torn last line.
func (s *dirStore) readChecked(c *chain, apply func(*Record, []byte) error) (torn int64, err error) {
	f := s.ledger
	if f == nil {
		lf, _, err := openLedger(s.fs, s.dir)
		if err != nil {
			return 0, err
		}
		defer lf.Close()
		f = lf
	}
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("runstate: stat %s: %w", s, err)
	}
	tornAt, _, err := replayJournal(s.fs, s.dir, f, fi.Size(), c, apply)
	if err != nil || tornAt < 0 {
		return 0, err
	}
	return fi.Size() - tornAt, nil
}

// verifyLedger is Verify's check of the ledger and the journal: it
// replays every record into st (through each) and adds what is wrong to
// rep. done: there is nothing more to check (the ledger is damaged, or
// holds no record).
func (s *dirStore) verifyLedger(rep *Report, st *state, each func(*Record, []byte) error) (done bool, err error) {
	f, lp, err := openLedger(s.fs, s.dir)
	if err != nil {
		return false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("runstate: stat %s: %w", lp, err)
	}
	size := fi.Size()
	wp := filepath.Join(s.dir, filepath.FromSlash(walFile))
	torn, j, err := replayJournal(s.fs, s.dir, f, size, &st.pos, each)
	if len(j.tail) > 0 && j.damage == nil && ledgerHolds(f, j.at, j.tail) {
		// A writer appended the journal's records after size was read
		// (a live run): they are in the ledger, and the tail was theirs.
		j.tail, torn = nil, -1
	}
	if len(j.tail) > 0 {
		from, to := j.seqs()
		what := fmt.Sprintf("ends before acknowledged records seq %d-%d, which only %s holds (the machine stopped before the kernel wrote them)", from, to, walFile)
		switch {
		case j.damage != nil:
			what = fmt.Sprintf("bytes %d-%d are damaged (%v; a power loss hits what was not yet fdatasync'd), but acknowledged records seq %d-%d there are whole in %s",
				j.at, min(size, j.at+int64(len(j.tail))), j.damage.Err, from, to, walFile)
		case j.torn >= 0:
			rep.Problems = append(rep.Problems, tornProblem(lp, from, j.torn, size-j.torn, s.repairCmd()+" moves it aside (the next writer would too)"))
		}
		rep.Problems = append(rep.Problems, Problem{File: lp, Line: int(from), Offset: j.at, What: what,
			Fix: "the next Open, or " + s.repairCmd() + ", copies them into the ledger"})
	}
	rep.Records, rep.Bytes = st.pos.seq, st.pos.offset
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		what, fix := ce.Err.Error(), "the ledger cannot be trusted from here on: "+cutAdvice(ce, s.fs, s.dir)
		if errors.Is(ce.Err, errCRLF) {
			what, fix = errCRLF.Error(), crlfFix(lp)+" and run verify again; nothing needs cutting"
		}
		rep.Problems = append(rep.Problems, Problem{File: lp, Line: ce.Line, Offset: ce.Offset, What: what, Fix: fix})
		return true, nil
	case errors.As(err, new(journalError)):
		fix := "make it readable: it may hold acknowledged records"
		if notOwnFile(err) {
			fix = "put the journal runstate wrote in its place (it may hold acknowledged records), or move it away; Open refuses the run until then"
		}
		rep.Problems = append(rep.Problems, Problem{File: wp, What: err.Error(), Fix: fix})
	case err != nil:
		return false, err
	}
	if torn >= 0 {
		rep.Problems = append(rep.Problems, tornProblem(lp, st.pos.seq+1, torn, size-torn, s.repairCmd()+" moves it aside (the next writer would too)"))
	}
	if st.pos.seq == 0 {
		if found := leftovers(s.fs, s.dir, true); len(found) > 0 {
			rep.Problems = append(rep.Problems, Problem{File: lp, Line: 1,
				What: "the ledger holds no record, but " + strings.Join(found, ", ") + " show that a run was here (the ledger was emptied or lost)",
				Fix:  lostFix})
			return true, nil
		}
		rep.Problems = append(rep.Problems, Problem{File: lp, What: "empty ledger: the run was never created",
			Fix: "Open the directory with Options.Request to create the run, or remove it"})
		return true, nil
	}
	return false, nil
}

// ledgerHolds reports whether the ledger f holds b at off (read now).
func ledgerHolds(f file, off int64, b []byte) bool {
	buf := make([]byte, len(b))
	_, err := f.ReadAt(buf, off)
	return err == nil && bytes.Equal(buf, b)
}

// verifyProjections is Verify's check that manifest.json and
// logs/next-steps.txt reflect the ledger (st); the handoff may lag by
// begins, up to settled, the last record that is not one. A projection
// ahead of st is fine when the ledger holds, now, the records it reflects:
// a writer appended them after Verify read the ledger (a live run).
func (s *dirStore) verifyProjections(rep *Report, st *state, settled int64) {
	rebuild := "the next Open or " + s.repairCmd() + " rebuilds it"
	var now *chain // the ledger as it stands now, past st: read when a projection is ahead
	catchUp := func() chain {
		if now == nil {
			now = new(chain)
			*now = s.readOn(st.pos)
		}
		return *now
	}
	// Both projections are read before the ledger is read on: what they
	// reflect was appended before they were written.
	mp := filepath.Join(s.dir, manifestFile)
	data, merr := readOwn(s.fs, s.dir, manifestFile, maxManifest)
	np := filepath.Join(s.dir, filepath.FromSlash(nextStepsFile))
	seq, nerr := nextStepsSeq(s.dir)
	var pos snapshotPos
	var derr error // manifest.json's, as a snapshot
	if merr == nil {
		var man *state
		man, pos, derr = decodeManifest(data)
		if derr == nil && (pos.End != st.pos.offset || pos.Hash != st.pos.hash) {
			if lost := lostBy(s.dir, man, st.identity.ID, catchUp()); lost != nil {
				// Records lost from the ledger's end: the projections are
				// their last trace, not to be rebuilt (store_file_newrun.go).
				lp := filepath.Join(s.dir, filepath.FromSlash(ledgerFile))
				rep.Problems = append(rep.Problems, Problem{File: lp, Line: int(lost.ledger + 1), Offset: catchUp().offset,
					What: "lost records: " + lost.what(), Fix: lost.fix()})
				rebuild = "do not rebuild it: it is the trace of the lost records; " + lost.fix()
			}
		}
	}
	if notOwn := "move it away: " + rebuild; notOwnFile(merr) {
		// A link, a FIFO, a directory (ownEntryError, notRegular).
		rep.Problems = append(rep.Problems, Problem{File: mp, What: "unreadable: " + merr.Error(), Fix: notOwn})
	} else if err := merr; err != nil {
		rep.Problems = append(rep.Problems, Problem{File: mp, What: "unreadable: " + err.Error(), Fix: rebuild})
	} else if err := derr; err != nil {
		rep.Problems = append(rep.Problems, Problem{File: mp, What: "not a valid snapshot: " + err.Error(), Fix: rebuild})
	} else if pos.End < st.pos.offset {
		rep.Problems = append(rep.Problems, Problem{File: mp, What: fmt.Sprintf("behind the ledger (reflects the record ending at byte %d, the ledger ends at %d)", pos.End, st.pos.offset),
			Fix: "normal while a session runs; otherwise " + rebuild})
	} else if pos.End > st.pos.offset && pos.End <= catchUp().offset && s.snapshotInLedger(pos) {
		// appended since
	} else if pos.End != st.pos.offset || pos.Hash != st.pos.hash {
		rep.Problems = append(rep.Problems, Problem{File: mp, What: fmt.Sprintf("does not reflect the ledger (reflects the record ending at byte %d with hash %.12s…, the ledger's record there ends at byte %d with hash %.12s…)", pos.End, pos.Hash, st.pos.offset, st.pos.hash),
			Fix: rebuild})
	}
	if notOwnFile(nerr) {
		rep.Problems = append(rep.Problems, Problem{File: np, What: nerr.Error(), Fix: "move it away: " + rebuild})
	} else if nerr != nil {
		rep.Problems = append(rep.Problems, Problem{File: np, What: nerr.Error(), Fix: rebuild})
	} else if seq < settled {
		rep.Problems = append(rep.Problems, Problem{File: np, What: fmt.Sprintf("behind the ledger (reflects seq %d, the ledger is at seq %d)", seq, st.pos.seq),
			Fix: "normal while a session runs; otherwise " + rebuild})
	} else if seq > st.pos.seq && seq > catchUp().seq {
		rep.Problems = append(rep.Problems, Problem{File: np, What: fmt.Sprintf("ahead of the ledger (reflects seq %d, the ledger is at seq %d)", seq, catchUp().seq),
			Fix: rebuild})
	}
}

// readOn returns the chain of the ledger as it stands now, read on from
// c: where the last whole record that continues it ends (c itself when
// the ledger cannot be read).
func (s *dirStore) readOn(c chain) chain {
	f, lp, err := openLedger(s.fs, s.dir)
	if err != nil {
		return c
	}
	defer f.Close()
	size, err := fileSize(f)
	if err != nil || size <= c.offset {
		return c
	}
	_, _ = replay(io.NewSectionReader(f, c.offset, size-c.offset), lp, &c, nil) // c stays at the last good record
	return c
}

// snapshotInLedger reports whether the ledger holds, now, the record a
// manifest reflects (pos).
func (s *dirStore) snapshotInLedger(pos snapshotPos) bool {
	f, _, err := openLedger(s.fs, s.dir)
	if err != nil {
		return false
	}
	defer f.Close()
	_, ok := snapshotHolds(f, pos)
	return ok
}

// nextStepsSeq reads the ledger seq that logs/next-steps.txt of the run in
// dir names in its first line.
func nextStepsSeq(dir string) (int64, error) {
	f, _, err := openOwn(osFS{}, dir, nextStepsFile, os.O_RDONLY)
	if err != nil {
		return 0, fmt.Errorf("unreadable: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(io.LimitReader(f, 4096)).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("no first line: %v", err)
	}
	_, after, ok := strings.Cut(line, "as of ledger seq ")
	if !ok {
		return 0, errors.New("first line does not name a ledger seq")
	}
	num, _, _ := strings.Cut(after, " ")
	seq, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("first line names a bad seq %q", num)
	}
	return seq, nil
}

// repairCmd is the command that repairs the run directory, for advice:
// 'runstate repair' on its absolute path, quoted for a shell (dirArg).
func (s *dirStore) repairCmd() string { return "runstate repair " + dirArg(s.dir) }
