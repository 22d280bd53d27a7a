package runstate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// refuseReplace refuses to create a run where one was. The ledger holds no
// record (it is missing, empty, or its only line does not parse), yet
// files that only a run leaves are there: manifest.json, the handoff,
// session lock files, or (beside a ledger that exists) outputs in
// artifacts/. A new run there would get a new id: every stage would be
// redone and every confirmed effect sent again, under a new key. So the
// ledger's loss is reported as corruption, and nothing is written. The
// caller holds the ledger lock; existed says whether the ledger was there
// before Open created it.
//
// A working directory whose run another store keeps (pgstore writes
// WorkDirFile there, naming the run's address) is refused too, with
// ErrMismatch: a run in files there would be a second run, apart from the
// one the directory's outputs belong to.
func (s *dirStore) refuseReplace(existed bool) error {
	if addr, ok := RunElsewhere(s.abs); ok {
		if !existed {
			_ = s.fs.Remove(s.path(ledgerFile))
		}
		return fmt.Errorf("%w: %s is the working directory of the run at %s (%s says so), not a run directory: Open would start a second run here, in files; open that run with its own store (pgstore's DB.Open), or read it with: runstate status %s",
			ErrMismatch, s.abs, addr, s.path(WorkDirFile), addr)
	}
	found := leftovers(s.fs, s.abs, existed)
	if len(found) == 0 {
		return nil
	}
	if !existed {
		_ = s.fs.Remove(s.path(ledgerFile)) // Open created it: leave the directory as it was
	}
	return lostLedger(s.path(ledgerFile), s.ledger, existed, found)
}

// leftovers lists the files in dir that only a run leaves (see
// refuseReplace).
func leftovers(fsys fileSystem, dir string, existed bool) []string {
	path := func(rel string) string { return filepath.Join(dir, filepath.FromSlash(rel)) }
	var found []string
	for _, rel := range []string{manifestFile, nextStepsFile} {
		if _, err := fsys.Stat(path(rel)); err == nil {
			found = append(found, rel)
		}
	}
	ents, _ := fsys.ReadDir(path(sessionsDir))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".lock") {
			found = append(found, sessionsDir+"/"+e.Name())
			break
		}
	}
	if existed {
		if ents, _ := os.ReadDir(path("artifacts")); len(ents) > 0 {
			found = append(found, "artifacts/"+ents[0].Name())
		}
	}
	return found
}

// lostLedger is the error for a ledger lp (open as f) that holds no record
// beside the leftovers found of a run.
func lostLedger(lp string, f file, existed bool, found []string) error {
	return &CorruptError{Path: lp, Line: 1, Err: fmt.Errorf(
		"the ledger %s, but %s show that a run was here: Open does not start a new run over it (it would get a new id, redo every stage and send every effect again); %s",
		lostWhat(f, existed), strings.Join(found, ", "), lostFix)}
}

// lostFix is what to do about a lost ledger.
const lostFix = "restore the ledger from a backup (or from a logs/ledger.jsonl.torn-* file), or move the directory away to start a new run"

func lostWhat(f file, existed bool) string {
	switch {
	case !existed:
		return "is missing"
	case f != nil:
		if size, err := fileSize(f); err == nil && size > 0 {
			return "holds no record (its first line does not parse)"
		}
	}
	return "is empty"
}
