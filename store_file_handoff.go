package runstate

import (
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"
)

// handoffDir holds, for each open session, the two files that
// logs/next-steps.txt is published from: <session>.0 and <session>.1.
// Close removes them; the next Open removes those of a killed session.
const handoffDir = "logs/handoff"

// handoffFiles publishes logs/next-steps.txt for one session. Its fields
// are used under the ledger lock; mu guards files and lens, which a crash
// may close in the middle of a batch.
type handoffFiles struct {
	next  int  // which handoff file publish writes next
	off   bool // hard links failed here: temp files from now on
	mu    sync.Mutex
	files [2]file  // the handoff files, kept open where possible
	lens  [2]int64 // the length of each, as last written
}

// linker is a fileSystem that can make hard links. osFS is one; without
// it, the handoff is replaced through a new temp file each time.
type linker interface {
	Link(oldname, newname string) error
}

// publishNextSteps replaces logs/next-steps.txt with data, atomically for
// readers, without creating or deleting a file. It alternates between the
// session's two handoff files: it rewrites the one that is not published,
// gives it a second name and renames that over next-steps.txt, whose
// previous file keeps its handoff name. Creating a file per append
// (writeAtomic) costs more than the ledger's own write and fsync on some
// file systems: ext4 allocates an inode (without a journal it skips every
// inode freed in the last 30 s, reading each), and on a rename over a file
// it flushes the new file and frees the old one's blocks. A reader that
// keeps next-steps.txt open across two appends may see the newer text.
// The caller holds the ledger lock.
func (h *handoffFiles) publish(s *dirStore, data []byte) error {
	l, ok := s.fs.(linker)
	if !ok || h.off {
		return writeAtomic(s.fs, s.path(tmpDir), s.session, s.path(nextStepsFile), data, false)
	}
	k := h.next
	buf := s.path(handoffDir + "/" + s.session + "." + strconv.Itoa(k))
	if err := h.write(s.fs, k, buf, data); err != nil {
		return err
	}
	pub := s.path(handoffDir + "/" + s.session + ".new")
	err := l.Link(buf, pub)
	if errors.Is(err, fs.ErrExist) { // left by a failed rename
		_ = s.fs.Remove(pub)
		err = l.Link(buf, pub)
	}
	if err != nil {
		// No hard links here (FAT, some network file systems): replace
		// through temp files from now on.
		h.off = true
		s.log.Debug("runstate: no hard links for the handoff; writing it through temp files", "err", err)
		return writeAtomic(s.fs, s.path(tmpDir), s.session, s.path(nextStepsFile), data, false)
	}
	if err := s.fs.Rename(pub, s.path(nextStepsFile)); err != nil {
		_ = s.fs.Remove(pub)
		return err
	}
	h.next ^= 1
	return nil
}

// writeHandoff rewrites handoff file k in place. Where it can (not on
// Windows, where a rename over an open file fails), it keeps the file
// open for the next time.
func (h *handoffFiles) write(fsys fileSystem, k int, path string, data []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if f := h.files[k]; f != nil {
		_, err := f.(io.WriterAt).WriteAt(data, 0)
		// Cut the file only when the new text is shorter than what it
		// holds (a system call spared on most appends).
		if err == nil && int64(len(data)) < h.lens[k] {
			err = f.Truncate(int64(len(data)))
		}
		if err != nil {
			h.lens[k] = math.MaxInt64 // unknown: cut next time
			return err
		}
		h.lens[k] = int64(len(data))
		return nil
	}
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Truncate(int64(len(data)))
	}
	if _, ok := f.(io.WriterAt); ok && err == nil && runtime.GOOS != "windows" {
		h.files[k] = f
		h.lens[k] = int64(len(data))
		return nil
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeHandoff removes this session's handoff files; next-steps.txt keeps
// the one it names. A second call does nothing.
func (h *handoffFiles) remove(s *dirStore) {
	for _, suffix := range []string{".0", ".1", ".new"} {
		_ = s.fs.Remove(s.path(handoffDir + "/" + s.session + suffix))
	}
}

// close closes the handoff files. It does not wait for a batch in
// progress (a crash closes them in the middle of one, as a killed
// process's exit would), only for a handoff file being written.
func (h *handoffFiles) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, f := range h.files {
		if f != nil {
			f.Close()
			h.files[k] = nil
		}
	}
}
