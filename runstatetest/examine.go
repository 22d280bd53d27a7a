package runstatetest

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/runstate/runstate"
)

// Findings is what Examine found wrong with a resumed run. Each entry is a
// sentence that names the file, the ledger seq or the stage concerned.
type Findings struct {
	Problems  []string // what runstate.Verify reports (ledger, artifacts, projections)
	Redone    []string // a stage begun again while complete, with no invalidate between
	Repeated  []string // an effect's intent recorded again after its confirm
	Litter    []string // temp files left in logs/tmp
	Different []string // artifacts that differ from the uninterrupted run's

	Metrics runstate.Metrics // the run's metrics, for reports
}

// OK reports whether nothing is wrong.
func (f *Findings) OK() bool {
	return len(f.Problems)+len(f.Redone)+len(f.Repeated)+len(f.Litter)+len(f.Different) == 0
}

// String lists every finding, one a line.
func (f *Findings) String() string {
	var b strings.Builder
	for _, g := range []struct {
		what string
		list []string
	}{{"verify", f.Problems}, {"redone", f.Redone}, {"repeated effect", f.Repeated}, {"litter", f.Litter}, {"artifact", f.Different}} {
		for _, s := range g.list {
			fmt.Fprintf(&b, "  %s: %s\n", g.what, s)
		}
	}
	return b.String()
}

// Examine checks a run directory after its last session closed: the whole
// ledger verifies (runstate.Verify: hash chain, artifacts, projections),
// no stage was begun again while it was complete unless an invalidate
// came between (a completed stage whose evidence held was never redone),
// no effect's intent was recorded again after its confirm (a confirmed
// effect was never repeated), no temp file was left in logs/tmp, and,
// when want is not "", every file outside logs/ and manifest.json is byte
// for byte the same as in want, a directory where the same work ran
// without interruption (a symbolic link points to the same place, and is
// not followed; a FIFO or a device is the same kind, and is not opened). It reads only; the error is for a directory it
// cannot read. Safe for concurrent use.
func Examine(dir, want string) (*Findings, error) {
	f := &Findings{}
	rep, err := runstate.Verify(dir)
	if err != nil {
		return nil, err
	}
	for _, p := range rep.Problems {
		f.Problems = append(f.Problems, p.String())
	}
	doneAt := map[string]int64{}      // stage -> seq of the complete/skip/approve that made it done
	failed := map[string]bool{}       // stage -> its last attempt failed (an await is not a review)
	review := map[string]bool{}       // stage -> awaits a review
	confirmedAt := map[string]int64{} // effect key -> seq of its confirm
	err = runstate.ReadLedger(dir, func(r *runstate.Record) error {
		switch r.Ev {
		case "complete", "skip":
			doneAt[r.Stage] = r.Seq
			failed[r.Stage] = false
		case "fail":
			failed[r.Stage] = true
		case "await":
			review[r.Stage] = r.Class == "" && !failed[r.Stage]
		case "approve":
			if review[r.Stage] { // an approved review is complete
				doneAt[r.Stage] = r.Seq
			}
			review[r.Stage], failed[r.Stage] = false, false
		case "invalidate":
			delete(doneAt, r.Stage)
			review[r.Stage], failed[r.Stage] = false, false
		case "begin":
			if at, ok := doneAt[r.Stage]; ok {
				f.Redone = append(f.Redone, fmt.Sprintf("stage %s begun again at seq %d (attempt %d) though complete since seq %d, with no invalidate between",
					r.Stage, r.Seq, r.Attempt, at))
			}
		case "confirm":
			if _, ok := confirmedAt[r.Key]; !ok {
				confirmedAt[r.Key] = r.Seq
			}
		case "intent":
			if at, ok := confirmedAt[r.Key]; ok {
				f.Repeated = append(f.Repeated, fmt.Sprintf("effect %s: intent again at seq %d after its confirm at seq %d", r.Key, r.Seq, at))
			}
		}
		return nil
	})
	if err != nil && len(f.Problems) == 0 {
		f.Problems = append(f.Problems, err.Error())
	}
	if st, err := runstate.Inspect(dir); err == nil {
		f.Metrics = st.Metrics
	}
	tmp := filepath.Join(dir, "logs", "tmp")
	if ents, err := os.ReadDir(tmp); err == nil {
		for _, e := range ents {
			f.Litter = append(f.Litter, filepath.Join(tmp, e.Name()))
		}
	}
	if want != "" {
		diff, err := compareTrees(want, dir)
		if err != nil {
			return nil, err
		}
		f.Different = diff
	}
	return f, nil
}

// CheckResumed runs Examine on dir and reports each finding with t.Errorf.
// It returns the findings (with the run's metrics) for further checks. It
// reads only; safe for concurrent use, from the goroutine running the
// test (it calls t.Fatalf when dir cannot be read).
func CheckResumed(t testing.TB, dir, want string) *Findings {
	t.Helper()
	f, err := Examine(dir, want)
	if err != nil {
		t.Fatalf("runstatetest: examine %s: %v", dir, err)
		return nil
	}
	if !f.OK() {
		t.Errorf("runstatetest: %s, resumed, is not what an uninterrupted run gives:\n%s", dir, f)
	}
	return f
}

// SameArtifacts reports through t every file outside logs/ and
// manifest.json that differs between want and got, is missing from one
// of them or has a different content, byte for byte (links and FIFOs
// compared as Examine compares them). It reads only; safe
// for concurrent use, from the goroutine running the test (it calls
// t.Fatalf when a directory cannot be read).
func SameArtifacts(t testing.TB, want, got string) {
	t.Helper()
	diff, err := compareTrees(want, got)
	if err != nil {
		t.Fatalf("runstatetest: %v", err)
	}
	for _, d := range diff {
		t.Errorf("runstatetest: %s", d)
	}
}

// outputs lists the files of a run directory that are not runstate's own,
// relative to it, with forward slashes, each with its content: a regular
// file's bytes; for a symbolic link, what it points to (an absolute target
// inside dir with dir replaced by "$RUN", so that the same link in two run
// directories compares equal), never followed; for a FIFO, a device or a
// socket, what it is, without opening it (which could block).
func outputs(dir string) (map[string]entry, error) {
	out := map[string]entry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "logs" {
				return filepath.SkipDir
			}
			return nil
		}
		if rel == "manifest.json" {
			return nil
		}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			to, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if filepath.IsAbs(to) {
				if r, err := filepath.Rel(dir, to); err == nil && filepath.IsLocal(r) {
					to = "$RUN/" + filepath.ToSlash(r)
				}
			}
			out[rel] = entry{kind: "a symbolic link to " + to}
			return nil
		case !t.IsRegular():
			out[rel] = entry{kind: fmt.Sprintf("not a regular file (%v)", t)}
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[rel] = entry{data: data}
		return nil
	})
	return out, err
}

// entry is a file of outputs: a regular file's bytes, or what it is
// (kind) when it is not one.
type entry struct {
	data []byte
	kind string
}

func compareTrees(want, got string) ([]string, error) {
	w, err := outputs(want)
	if err != nil {
		return nil, err
	}
	g, err := outputs(got)
	if err != nil {
		return nil, err
	}
	var diff []string
	names := map[string]bool{}
	for k := range w {
		names[k] = true
	}
	for k := range g {
		names[k] = true
	}
	keys := make([]string, 0, len(names))
	for k := range names {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		wd, inW := w[k]
		gd, inG := g[k]
		switch {
		case !inG:
			diff = append(diff, fmt.Sprintf("%s: missing (the uninterrupted run in %s has it)", filepath.Join(got, k), want))
		case !inW:
			diff = append(diff, fmt.Sprintf("%s: extra (the uninterrupted run in %s has no such file)", filepath.Join(got, k), want))
		case wd.kind != "" || gd.kind != "":
			if wd.kind != gd.kind {
				what := func(e entry) string {
					if e.kind == "" {
						return "a file"
					}
					return e.kind
				}
				diff = append(diff, fmt.Sprintf("%s: %s, where the uninterrupted run's is %s", filepath.Join(got, k), what(gd), what(wd)))
			}
		case !bytes.Equal(wd.data, gd.data):
			wd, gd := wd.data, gd.data
			i := 0
			for i < len(wd) && i < len(gd) && wd[i] == gd[i] {
				i++
			}
			diff = append(diff, fmt.Sprintf("%s: %d bytes differ from the uninterrupted run's %d from byte %d", filepath.Join(got, k), len(gd), len(wd), i))
		}
	}
	return diff, nil
}
