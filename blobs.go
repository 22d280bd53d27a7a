package runstate

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Outputs across machines. A Store whose Blobs is not nil
// spans machines: each keeps its own local directory, and the bytes of
// every recorded output are in the store too, content addressed. Complete
// and Await store the bytes the store lacks before the record that names
// them; Begin fetches the outputs of its After stages where the local copy
// differs, and restores a done stage's missing or altered local copy (the
// store's bytes are the truth; a person forces a redo with Invalidate).
// With no Blobs (the file store) none of this runs.

// putUnasked is the size up to which an output's bytes are put without
// asking the store whether it has them.
const putUnasked = 64 << 10

// keptMax is how many bytes of a stage's small WriteFile outputs the stage
// keeps, where the store keeps blobs, so that Complete stores them from
// memory instead of opening and reading each file again (8 system calls an
// output).
const keptMax = 1 << 20

// kept is the bytes of a small output that WriteFile wrote, with their
// hex SHA-256: what the record names unless the output was declared again
// with Output since (then hashed from the file, and read from it).
type kept struct {
	sum  string
	data []byte
}

// keep notes data, which WriteFile wrote to rel and hashed to sum, when
// the store keeps outputs' bytes and the stage's kept bytes stay within
// keptMax. The caller holds st.mu.
func (st *Stage) keep(rel, sum string, data []byte) {
	if k, ok := st.kept[rel]; ok {
		st.keptBytes -= len(k.data)
		delete(st.kept, rel)
	}
	if st.run.store.Blobs() == nil || len(data) > putUnasked || st.keptBytes+len(data) > keptMax {
		return
	}
	if st.kept == nil {
		st.kept = map[string]kept{}
	}
	st.kept[rel] = kept{sum: sum, data: bytes.Clone(data)}
	st.keptBytes += len(data)
}

// storeOutputs puts the bytes of outs that the store lacks before the
// record that names them is committed: from kept (the bytes WriteFile
// wrote, when the record names them) or else read from the local
// directory.
func (r *Run) storeOutputs(ctx context.Context, outs []Output, kept map[string]kept) error {
	bs := r.store.Blobs()
	if bs == nil || len(outs) == 0 {
		return nil
	}
	// A small output is put without asking (Put is idempotent, and
	// sending it costs what asking would); the store is asked which of
	// the others it lacks.
	need := map[string]bool{}
	var sums []string
	for _, o := range outs {
		if _, bad := r.damaged.Load(o.SHA256); o.Size <= putUnasked || bad {
			need[o.SHA256] = true // a damaged one: the store says it has it
		} else {
			sums = append(sums, o.SHA256)
		}
	}
	if len(sums) > 0 {
		missing, err := bs.Missing(ctx, sums)
		if err != nil {
			return fmt.Errorf("runstate: store the outputs' bytes in %s: %w; nothing was recorded", r.store, err)
		}
		for _, s := range missing {
			need[s] = true
		}
	}
	for _, o := range outs {
		if !need[o.SHA256] {
			continue
		}
		need[o.SHA256] = false // once per content
		if err := r.putOutput(ctx, bs, o, kept); err != nil {
			return fmt.Errorf("runstate: store output %s in %s: %w; nothing was recorded", o.Path, r.store, err)
		}
		if _, bad := r.damaged.LoadAndDelete(o.SHA256); bad {
			r.log.Info("runstate: an output's bytes, damaged in the store, were put again", "output", o.Path, "store", r.store.String())
		}
	}
	return nil
}

// putOutput puts o's bytes: those WriteFile kept when the record names
// them, else its file's.
func (r *Run) putOutput(ctx context.Context, bs Blobs, o Output, kept map[string]kept) error {
	if k, ok := kept[o.Path]; ok && k.sum == o.SHA256 {
		return bs.Put(ctx, o.SHA256, o.Size, bytes.NewReader(k.data))
	}
	f, _, err := openRegular(os.O_RDONLY, func(flag int) (*os.File, error) { return r.out.root.OpenFile(filepath.FromSlash(o.Path), flag, 0) })
	if err != nil {
		return err
	}
	defer f.Close()
	return bs.Put(ctx, o.SHA256, o.Size, f)
}

// afterOutputs returns the outputs of the stages ev names with After
// that are complete, as the state s records them (under the lock, with the
// fingerprints; or the session's view outside it), and the stage of each.
// A stage running again keeps its last outputs in s until it ends: they
// are left out, or a fetch would write the old bytes over the ones its
// attempt is writing in this directory.
func (ev *evidence) afterOutputs(s *state) (outs []Output, of []string) {
	for _, dep := range ev.after {
		if d := s.stages[dep]; d != nil && d.State == StateComplete {
			outs = append(outs, d.Outputs...)
			for range d.Outputs {
				of = append(of, dep)
			}
		}
	}
	return outs, of
}

// afterDone reports whether every stage ev names with After is done in
// s: else Begin is not ready, and looks at no After output.
func (ev *evidence) afterDone(s *state) bool {
	for _, dep := range ev.after {
		if d := s.stages[dep]; d == nil || !done(d.State) {
			return false
		}
	}
	return true
}

// fetchOutputs makes the local copy of each of outs, outputs of the
// stages of, what the record says, from the store's bytes where it is
// missing or differs.
func (r *Run) fetchOutputs(ctx context.Context, outs []Output, of []string) error {
	bs := r.store.Blobs()
	if bs == nil {
		return nil
	}
	for i, o := range outs {
		if sum, size, err := r.out.hashSized(o.Path, o.Size); err == nil && sum == o.SHA256 && size == o.Size {
			continue
		}
		if err := r.fetchOutput(ctx, bs, o); err != nil {
			if errors.Is(err, ErrCorrupt) {
				// Damaged in the store: a session of that stage whose
				// restore meets them as this fetch did runs it again and
				// puts the bytes anew (storeOutputs); an invalidate's
				// redo would not (Missing says they are there).
				return fmt.Errorf("%w; stage %s's stored output %s is damaged: run stage %s in a working directory without that output (remove it, or use a new directory): its restore fails as this fetch did, so it runs again and stores the bytes anew; then begin this stage again", err, of[i], o.Path, of[i])
			}
			return err
		}
	}
	return nil
}

// damagedBytes is the error for an output's bytes from the store that
// are not the recorded ones: errors.Is(err, ErrCorrupt) holds, but its
// text says that the stored bytes are damaged, not the ledger.
type damagedBytes struct{ what string }

func (e *damagedBytes) Error() string        { return "runstate: stored output bytes are damaged: " + e.what }
func (e *damagedBytes) Is(target error) bool { return target == ErrCorrupt }

// readErrOf reads r, keeping in *err an error other than io.EOF that r
// returned.
type readErrOf struct {
	r   io.Reader
	err *error
}

func (e readErrOf) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		*e.err = err
	}
	return n, err
}

// fetchOutput streams one output's bytes from the store into a temp file
// in logs/tmp, checks them, and renames it into place.
func (r *Run) fetchOutput(ctx context.Context, bs Blobs, o Output) (err error) {
	if err := r.out.checkLanding(o.Path, false); err != nil {
		return err
	}
	rc, err := bs.Get(ctx, o.SHA256)
	if err != nil {
		return fmt.Errorf("runstate: fetch output %s from %s: %w", o.Path, r.store, err)
	}
	defer rc.Close()
	h := sha256.New()
	var bad error // the store's bytes could not be read, or are not the recorded ones
	err = r.out.writeFrom(o.Path, func(w io.Writer) error {
		n, err := io.Copy(io.MultiWriter(w, h), readErrOf{rc, &bad})
		if err != nil {
			return err
		}
		if n != o.Size || hex.EncodeToString(h.Sum(nil)) != o.SHA256 {
			bad = &damagedBytes{fmt.Sprintf("the store's bytes (%d) do not hash to the recorded sha256 %s", n, o.SHA256)}
			return bad
		}
		return nil
	})
	if bad != nil && err != nil {
		err = bad // what the store gave: "output PATH" adds nothing to "fetch output PATH" below
	}
	if err != nil {
		if errors.Is(err, ErrCorrupt) { // the store's check, or this one
			r.damaged.Store(o.SHA256, true)
		}
		return fmt.Errorf("runstate: fetch output %s from %s: %w", o.Path, r.store, err)
	}
	return nil
}

// restoreOutputs restores a done stage's outputs whose local copy is
// missing or altered (reason, from outputs.check) from the store's bytes.
// It returns "" when the local copies are as recorded now, else why the
// stage must run again (the reason, or that the store lacks the bytes or
// holds others than the record's). Bytes that cannot be written here (a
// link out of the directory, no permission, a full disk) or read from
// the store now are an error: the stage is done for the run's other
// sessions, and a new attempt from this one would record a failure for
// them all, for a fault of this directory's or of this moment's.
func (r *Run) restoreOutputs(ctx context.Context, stage string, outs []Output, reason string) (string, error) {
	bs := r.store.Blobs()
	if bs == nil || reason == "" {
		return reason, nil
	}
	for _, o := range outs {
		if sum, size, err := r.out.hashSized(o.Path, o.Size); err == nil && sum == o.SHA256 && size == o.Size {
			continue
		}
		if err := r.fetchOutput(ctx, bs, o); err != nil {
			switch {
			case errors.Is(err, fs.ErrNotExist):
				return fmt.Sprintf("output %s missing from the shared store", o.Path), nil
			case errors.Is(err, ErrCorrupt):
				r.log.Warn("runstate: the store's bytes of an output are not the recorded ones: the stage runs again", "output", o.Path, "store", r.store.String(), "err", err)
				return reason, nil
			}
			return "", fmt.Errorf("%w (stage %s is complete: nothing was recorded; %s)", err, stage, restoreAdvice(err))
		}
		r.log.Info("runstate: restored an output from the store", "output", o.Path, "store", r.store.String())
	}
	return r.out.check(outs), nil
}

// restoreAdvice says what to do about an output that could not be
// restored.
func restoreAdvice(err error) string {
	if errors.Is(err, ErrInvalid) {
		return "fix this working directory (the output's path must stay inside it), then run again"
	}
	return "run again once the cause is gone"
}
