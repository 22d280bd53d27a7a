package runstate

import (
	"fmt"
	"os"
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
func (r *Run) refuseReplace(existed bool) error {
	var found []string
	for _, rel := range []string{manifestFile, nextStepsFile} {
		if _, err := r.fs.Stat(r.path(rel)); err == nil {
			found = append(found, rel)
		}
	}
	ents, _ := r.fs.ReadDir(r.path(sessionsDir))
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".lock") {
			found = append(found, sessionsDir+"/"+e.Name())
			break
		}
	}
	if existed {
		if ents, _ := os.ReadDir(r.path("artifacts")); len(ents) > 0 {
			found = append(found, "artifacts/"+ents[0].Name())
		}
	}
	if len(found) == 0 {
		return nil
	}
	what := "is missing"
	if !existed {
		_ = r.fs.Remove(r.path(ledgerFile)) // Open created it: leave the directory as it was
	} else {
		what = "is empty"
		if size, err := fileSize(r.ledger); err == nil && size > 0 {
			what = "holds no record (its first line does not parse)"
		}
	}
	return &CorruptError{Path: r.path(ledgerFile), Line: 1, Err: fmt.Errorf(
		"the ledger %s, but %s show that a run was here: Open does not start a new run over it (it would get a new id, redo every stage and send every effect again); restore the ledger from a backup (or from a logs/ledger.jsonl.torn-* file), or move the directory away to start a new run",
		what, strings.Join(found, ", "))}
}
