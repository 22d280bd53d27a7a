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

// Records lost from the ledger's end. A ledger may lose whole records
// from its end and keep no torn line to show for it: restored from an old
// backup, copied badly, or cut by a file system that lost a suffix. A
// torn or missing tail that was never acknowledged is normal after a
// crash, and manifest.json may legitimately reflect records the ledger no
// longer has: begins, open records and what an Open records of gone
// sessions are appended without an fsync and may be published before a
// power loss drops them. But the records that end a stage (complete, skip,
// fail, await) and an effect's intent, confirm, unconfirmed and
// resolution are made durable before any projection shows them: a
// manifest that shows one the ledger (with what logs/ledger.wal holds)
// does not have proves the loss of acknowledged records. Rebuilding the
// projections from the short ledger would drop that proof for good and
// redo the stages it shows done, so Open, Inspect and Repair refuse it
// (Repair unless RepairOptions.AcceptLoss) and Verify reports it.

// lostRecords is the error of a ledger that ends before records that
// manifest.json shows were acknowledged.
type lostRecords struct {
	dir      string // the run directory, for the repair command
	ledger   int64  // the ledger's last seq
	durable  int64  // the newest seq manifest.json shows was made durable
	manifest int64  // the seq manifest.json reflects
	proof    string // the record at durable: `stage "e" complete`
}

func (e *lostRecords) Error() string {
	return e.what() + ", and the projections are not rebuilt from it, which would drop the last trace of those records and redo what they recorded as done; " + e.fix()
}

// what says what was lost, and what shows it.
func (e *lostRecords) what() string {
	return fmt.Sprintf("the ledger ends at seq %d, but %s reflects seq %d: %d records are missing from its end, and records up to seq %d were acknowledged (%s at seq %d); the ledger was cut back (restored from an old backup, copied badly, or a file system lost its end)",
		e.ledger, manifestFile, e.manifest, e.manifest-e.ledger, e.durable, e.proof, e.durable)
}

// fix is what to do about lost records.
func (e *lostRecords) fix() string {
	return fmt.Sprintf("restore %s from a backup that holds seq %d-%d, or accept the loss with: runstate repair -accept-loss %s (manifest.json and logs/next-steps.txt are kept aside)",
		ledgerFile, e.ledger+1, e.manifest, dirArg(e.dir))
}

// lostBy returns the lost records that man, the state of a manifest.json
// that is not a snapshot of the ledger, proves for a ledger of the run id
// whose last record is c; nil when it proves none. A ledger without a
// record is refuseReplace's business, and the manifest of another run
// (copied in) proves nothing.
func lostBy(dir string, man *state, id string, c chain) *lostRecords {
	if c.seq == 0 || man.identity.ID != id {
		return nil
	}
	seq, proof := durableProof(man)
	if seq <= c.seq {
		return nil
	}
	return &lostRecords{dir: dir, ledger: c.seq, durable: seq, manifest: max(man.pos.seq, seq), proof: proof}
}

// durableProof returns the newest record that the state s (a manifest's)
// shows was made durable before s was published, and names it: the
// newest end of a stage or record of an effect (see lostRecords). 0 when
// it shows none.
func durableProof(s *state) (seq int64, proof string) {
	for _, st := range s.stages {
		switch st.State {
		case StateComplete, StateSkipped, StateFailed, StateAwaiting, StateFatal:
			if st.Seq > seq {
				seq, proof = st.Seq, fmt.Sprintf("stage %q %s", st.Name, st.State)
			}
		}
		if st.DoneSeq > seq {
			seq, proof = st.DoneSeq, fmt.Sprintf("stage %q done", st.Name)
		}
	}
	for _, e := range s.effects {
		switch e.State {
		case EffectIntent, EffectConfirmed, EffectUnconfirmed, EffectNotSent:
			if e.Seq > seq {
				seq, proof = e.Seq, fmt.Sprintf("effect %q %s", e.Key, e.State)
			}
		}
	}
	return seq, proof
}

// lostIn reads manifest.json in dir and returns the lost records it
// proves for a ledger of the run id whose last record is c (see lostBy).
func lostIn(fsys fileSystem, dir, id string, c chain) *lostRecords {
	data, err := readOwn(fsys, dir, manifestFile, maxManifest)
	if err != nil {
		return nil
	}
	man, _, err := decodeManifest(data)
	if err != nil {
		return nil
	}
	return lostBy(dir, man, id, c)
}
