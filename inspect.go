package runstate

import (
	"context"
	"fmt"
	"path/filepath"
)

// Inspect reads the run in dir as it stands, from any process, while
// writers are active: it takes no lock and writes nothing. It resumes from
// manifest.json when that is a valid snapshot and reads the ledger records
// after it. A torn last line (a writer dying, or one still mid-write) is
// ignored and reported in Status.Torn. Inspect fails with a *CorruptError
// for a damaged ledger, ErrVersion for an unknown format, and ErrInvalid,
// as Open does, when logs/, the ledger or the journal is a symbolic link,
// which it does not follow (a linked manifest.json is not read). Safe for
// concurrent use, from any number of goroutines and processes.
func Inspect(dir string) (*Status, error) {
	return inspect(context.Background(), newDirStore(dir, Options{}), dir)
}

// NextSteps returns the handoff for the run in dir, rendered in memory from
// the ledger as it stands: what logs/next-steps.txt holds when it is
// current, even when that file is behind or missing. Like Inspect it takes
// no lock, writes nothing and may run from any process while writers are
// active; its first line names the ledger seq it reflects. It never
// rewrites logs/next-steps.txt (the next writer or Open does). Safe for
// concurrent use.
func NextSteps(dir string) (string, error) {
	return NextStepsStore(context.Background(), newDirStore(dir, Options{}), dir)
}

// ReadLedger calls fn for each record of the ledger in dir, in order,
// checking the whole hash chain as it goes, then for the acknowledged
// records that a machine crash left only in the journal (the next Open
// copies them into the ledger: see the package doc). A torn last line is not passed to
// fn. Damage before the last line stops the read with a *CorruptError
// naming the line and byte offset, after fn saw every record before it; an
// unknown format is ErrVersion. It takes no lock and writes nothing; fn
// may stop the read by returning an error, which ReadLedger returns. Safe
// for concurrent use, also while other processes append (fn sees the
// records present when the read reaches them).
func ReadLedger(dir string, fn func(*Record) error) error {
	return ReadStore(context.Background(), newDirStore(dir, Options{}), fn)
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
	Dir string `json:"dir"` // the run directory, as passed to Verify
	// Address is the run as the commands in the Problems' Fixes name it,
	// unquoted: the run directory's absolute path, or the store's
	// Addresser.Address; "" for a store that no runstate command reads.
	Address  string    `json:"address,omitempty"`
	Records  int64     `json:"records"`  // records that passed the check
	Bytes    int64     `json:"bytes"`    // ledger bytes that passed the check
	Problems []Problem `json:"problems"` // empty when everything holds; never nil
}

// OK reports whether Verify found nothing wrong. It only reads r: safe
// for concurrent use with other reads.
func (r *Report) OK() bool { return len(r.Problems) == 0 }

// Verify checks the whole run in dir without a snapshot, the way SQLite's
// PRAGMA integrity_check does: every ledger line (seq, hash chain, a torn
// tail), acknowledged records that a machine crash left only in the
// journal (a problem the next Open fixes), every artifact against its
// recorded hash, and whether
// manifest.json and logs/next-steps.txt reflect the ledger
// (next-steps.txt may lag by begin records: see the package doc). It takes no
// lock and writes nothing, so it is safe for concurrent use, from any
// number of goroutines and processes, while writers are active: records
// appended after it read the ledger are no problem (neither in the journal
// nor in a projection), and projections behind the ledger are said to be
// normal while a session runs. The error is non-nil only when the ledger cannot be read at all
// (logs/ or the ledger a symbolic link, which Verify does not follow:
// ErrInvalid) or is in an unknown format (ErrVersion); what is wrong is
// in Report.Problems.
func Verify(dir string) (*Report, error) {
	return VerifyStore(context.Background(), newDirStore(dir, Options{}), dir)
}

// tornProblem is Verify's problem for a torn last line of n bytes at off;
// fix says what removes it.
func tornProblem(lp string, line, off, n int64, fix string) Problem {
	return Problem{File: lp, Line: int(line), Offset: off,
		What: fmt.Sprintf("torn last line (%d bytes without a newline): a writer died mid-append; it was never acknowledged", n),
		Fix:  fix}
}

// checkArtifacts checks every artifact of st against its recorded hash in
// the local directory dir; the fixes name the run at at.
func checkArtifacts(dir string, st *state, at place) ([]Problem, error) {
	out, err := openOutputs(dir, "", 0)
	if err != nil {
		return nil, err
	}
	defer out.close()
	var probs []Problem
	for _, a := range st.artifacts(st.stageNames()) {
		if why := out.check([]Output{{Path: a.Path, SHA256: a.SHA256, Size: a.Size}}); why != "" {
			probs = append(probs, Problem{File: filepath.Join(dir, filepath.FromSlash(a.Path)),
				What: fmt.Sprintf("%s (recorded by stage %s at seq %d)", why, a.Stage, a.Seq),
				Fix:  fmt.Sprintf("the next run of %s redoes it; or %s", a.Stage, at.invalidate(a.Stage))})
		}
	}
	return probs, nil
}
