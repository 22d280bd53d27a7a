package runstate

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Inspect reads the run in dir as it stands, from any process, while
// writers are active: it takes no lock and writes nothing. It resumes from
// manifest.json when that is a valid snapshot and reads the ledger records
// after it. A torn last line (a writer dying, or one still mid-write) is
// ignored and reported in Status.Torn. Inspect fails with a *CorruptError
// for a damaged ledger and ErrVersion for an unknown format. Safe for
// concurrent use, from any number of goroutines and processes.
func Inspect(dir string) (*Status, error) {
	st, torn, err := readOnly(dir)
	if err != nil {
		return nil, err
	}
	s := st.status(dir)
	s.Torn = torn
	return s, nil
}

// NextSteps returns the handoff for the run in dir, rendered in memory from
// the ledger as it stands: what logs/next-steps.txt holds when it is
// current, even when that file is behind or missing. Like Inspect it takes
// no lock, writes nothing and may run from any process while writers are
// active; its first line names the ledger seq it reflects. It never
// rewrites logs/next-steps.txt (the next writer or Open does). Safe for
// concurrent use.
func NextSteps(dir string) (string, error) {
	st, _, err := readOnly(dir)
	if err != nil {
		return "", err
	}
	return st.nextSteps(dirArg(dir)), nil
}

// openLedger opens the ledger of the run in dir for reading. Its error
// says whether dir is missing or is not a run directory.
func openLedger(dir string) (*os.File, string, error) {
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	f, err := os.Open(lp)
	if err == nil {
		return f, lp, nil
	}
	if isNotExist(err) {
		if _, derr := os.Stat(dir); derr != nil {
			return nil, lp, fmt.Errorf("runstate: no run directory at %s: %w", dir, derr)
		}
		return nil, lp, fmt.Errorf("runstate: %s is not a run directory (no %s): %w", dir, ledgerFile, fs.ErrNotExist)
	}
	return nil, lp, fmt.Errorf("runstate: cannot read the ledger: %w", err) // err names the file
}

// readOnly loads the state of dir without a lock or a write.
func readOnly(dir string) (*state, int64, error) {
	f, lp, err := openLedger(dir)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	// Records a machine crash kept out of the ledger, or damaged in it,
	// are read from the journal (wal.go).
	st, _, _, err := loadState(osFS{}, dir, f)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	torn := max(0, fi.Size()-st.pos.offset)
	if st.pos.seq == 0 {
		if found := leftovers(osFS{}, dir, true); len(found) > 0 {
			return nil, 0, lostLedger(lp, f, true, found)
		}
		return nil, 0, fmt.Errorf("runstate: %s holds no complete record: the run was never created (Open it with Options.Request to create it)", lp)
	}
	return st, torn, nil
}

// ReadLedger calls fn for each record of the ledger in dir, in order,
// checking the whole hash chain as it goes, then for the acknowledged
// records that a machine crash left only in logs/ledger.wal (the next
// Open copies them into the ledger). A torn last line is not passed to
// fn. Damage before the last line stops the read with a *CorruptError
// naming the line and byte offset, after fn saw every record before it; an
// unknown format is ErrVersion. It takes no lock and writes nothing; fn
// may stop the read by returning an error, which ReadLedger returns. Safe
// for concurrent use, also while other processes append (fn sees the
// records present when the read reaches them).
func ReadLedger(dir string, fn func(*Record) error) error {
	f, lp, err := openLedger(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var c chain
	each := func(rec *Record, _ []byte) error {
		rc := *rec // replay reuses rec; fn may keep it
		return fn(&rc)
	}
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("runstate: stat %s: %w", lp, err)
	}
	_, _, err = replayJournal(osFS{}, dir, f, fi.Size(), &c, each)
	return err
}

// Problem is one thing Verify found wrong.
type Problem struct {
	File   string `json:"file"`             // path of the file concerned
	Line   int    `json:"line,omitempty"`   // ledger line, when it is one
	Offset int64  `json:"offset,omitempty"` // byte offset of that line
	What   string `json:"what"`             // what is wrong
	Fix    string `json:"fix,omitempty"`    // what to do about it
}

// String is the problem on one line: the file (and ledger line and byte
// offset), what is wrong and what to do about it.
func (p Problem) String() string {
	s := p.File
	if p.Line > 0 {
		s += fmt.Sprintf(" line %d (byte %d)", p.Line, p.Offset)
	}
	s += ": " + p.What
	if p.Fix != "" {
		s += "; " + p.Fix
	}
	return s
}

// Report is the result of Verify: a plain value, safe to keep and share.
type Report struct {
	Dir      string    `json:"dir"`      // the run directory, as passed to Verify
	Records  int64     `json:"records"`  // records that passed the check
	Bytes    int64     `json:"bytes"`    // ledger bytes that passed the check
	Problems []Problem `json:"problems"` // empty when everything holds; never nil
}

// OK reports whether Verify found nothing wrong.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// Verify checks the whole run in dir without a snapshot, the way SQLite's
// PRAGMA integrity_check does: every ledger line (seq, hash chain, a torn
// tail), acknowledged records that a machine crash left only in
// logs/ledger.wal (a problem the next Open fixes), every artifact against its recorded hash, and whether
// manifest.json and logs/next-steps.txt reflect the ledger
// (next-steps.txt may lag by begin records: see the package doc). It takes no
// lock and writes nothing, so it is safe for concurrent use, from any
// number of goroutines and processes, while writers are active (the
// projections may then lag the ledger by a few records, and Verify says
// so). The error is non-nil only when the ledger cannot be read at all or
// is in an unknown format (ErrVersion); what is wrong is in
// Report.Problems.
func Verify(dir string) (*Report, error) {
	rep := &Report{Dir: dir, Problems: []Problem{}}
	f, lp, err := openLedger(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st := newState()
	var settled int64 // the last record that is not a begin: the handoff lags begins (handoffLag)
	each := func(rec *Record, line []byte) error {
		_ = st.replay(rec, line)
		if rec.Ev != evBegin {
			settled = rec.Seq
		}
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("runstate: stat %s: %w", lp, err)
	}
	size := fi.Size()
	wp := filepath.Join(dir, filepath.FromSlash(walFile))
	torn, j, err := replayJournal(osFS{}, dir, f, size, &st.pos, each)
	if len(j.tail) > 0 {
		from, to := j.seqs()
		what := fmt.Sprintf("ends before acknowledged records seq %d-%d, which only %s holds (the machine stopped before the kernel wrote them)", from, to, walFile)
		switch {
		case j.damage != nil:
			what = fmt.Sprintf("bytes %d-%d are damaged (%v; a power loss hits what was not yet fdatasync'd), but acknowledged records seq %d-%d there are whole in %s",
				j.at, min(size, j.at+int64(len(j.tail))), j.damage.Err, from, to, walFile)
		case j.torn >= 0:
			rep.Problems = append(rep.Problems, tornProblem(lp, from, j.torn, size-j.torn))
		}
		rep.Problems = append(rep.Problems, Problem{File: lp, Line: int(from), Offset: j.at, What: what,
			Fix: "the next Open, or 'runstate repair DIR', copies them into the ledger"})
	}
	rep.Records, rep.Bytes = st.pos.seq, st.pos.offset
	var ce *CorruptError
	switch {
	case errors.As(err, &ce):
		rep.Problems = append(rep.Problems, Problem{File: lp, Line: ce.Line, Offset: ce.Offset, What: ce.Err.Error(),
			Fix: "the ledger cannot be trusted from here on: " + cutAdvice(ce)})
		return rep, nil
	case errors.As(err, new(journalError)):
		rep.Problems = append(rep.Problems, Problem{File: wp, What: err.Error(), Fix: "make it readable: it may hold acknowledged records"})
	case err != nil:
		return nil, err
	}
	if torn >= 0 {
		rep.Problems = append(rep.Problems, tornProblem(lp, st.pos.seq+1, torn, size-torn))
	}
	if st.pos.seq == 0 {
		if found := leftovers(osFS{}, dir, true); len(found) > 0 {
			rep.Problems = append(rep.Problems, Problem{File: lp, Line: 1,
				What: "the ledger holds no record, but " + strings.Join(found, ", ") + " show that a run was here (the ledger was emptied or lost)",
				Fix:  lostFix})
			return rep, nil
		}
		rep.Problems = append(rep.Problems, Problem{File: lp, What: "empty ledger: the run was never created",
			Fix: "Open the directory with Options.Request to create the run, or remove it"})
		return rep, nil
	}
	probs, err := checkArtifacts(dir, st)
	if err != nil {
		return nil, err
	}
	rep.Problems = append(rep.Problems, probs...)
	mp := filepath.Join(dir, manifestFile)
	if data, err := os.ReadFile(mp); err != nil {
		rep.Problems = append(rep.Problems, Problem{File: mp, What: "unreadable: " + err.Error(), Fix: "the next Open or 'runstate repair DIR' rebuilds it"})
	} else if _, pos, err := decodeManifest(data); err != nil {
		rep.Problems = append(rep.Problems, Problem{File: mp, What: "not a valid snapshot: " + err.Error(), Fix: "the next Open or 'runstate repair DIR' rebuilds it"})
	} else if pos.End != st.pos.offset || pos.Hash != st.pos.hash {
		rep.Problems = append(rep.Problems, Problem{File: mp, What: fmt.Sprintf("behind the ledger (reflects the record ending at byte %d, the ledger ends at %d)", pos.End, st.pos.offset),
			Fix: "normal while a session runs; otherwise the next Open or 'runstate repair DIR' rebuilds it"})
	}
	np := filepath.Join(dir, filepath.FromSlash(nextStepsFile))
	if seq, err := nextStepsSeq(np); err != nil {
		rep.Problems = append(rep.Problems, Problem{File: np, What: err.Error(), Fix: "the next Open or 'runstate repair DIR' rebuilds it"})
	} else if seq < settled || seq > st.pos.seq {
		rep.Problems = append(rep.Problems, Problem{File: np, What: fmt.Sprintf("reflects seq %d, the ledger is at seq %d", seq, st.pos.seq),
			Fix: "the next Open or 'runstate repair DIR' rebuilds it"})
	}
	return rep, nil
}

// tornProblem is Verify's problem for a torn last line of n bytes at off.
func tornProblem(lp string, line, off, n int64) Problem {
	return Problem{File: lp, Line: int(line), Offset: off,
		What: fmt.Sprintf("torn last line (%d bytes without a newline): a writer died mid-append; it was never acknowledged", n),
		Fix:  "'runstate repair DIR' moves it aside (the next writer would too)"}
}

// nextStepsSeq reads the ledger seq that logs/next-steps.txt names in its
// first line.
func nextStepsSeq(p string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, fmt.Errorf("unreadable: %v", err)
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

// checkArtifacts checks every artifact of st against its recorded hash in
// the local directory dir.
func checkArtifacts(dir string, st *state) ([]Problem, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var probs []Problem
	for _, a := range st.artifacts(st.stageNames()) {
		if why := checkOutputsIn(root, []Output{{Path: a.Path, SHA256: a.SHA256, Size: a.Size}}); why != "" {
			probs = append(probs, Problem{File: filepath.Join(dir, filepath.FromSlash(a.Path)),
				What: fmt.Sprintf("%s (recorded by stage %s at seq %d)", why, a.Stage, a.Seq),
				Fix:  fmt.Sprintf("the next run of %s redoes it; or 'runstate invalidate DIR %s -reason TEXT'", a.Stage, a.Stage)})
		}
	}
	return probs, nil
}
