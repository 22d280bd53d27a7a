package runstate

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/runstate/runstate/internal/testhook"
)

// fileSystem is the seam between the file store and the operating system
// for the files runstate owns (the ledger, the journal, the projections,
// the temp files): the one fault seam. Tests replace it to inject faults (a
// full disk, a failed fsync, power loss: internal/faultfs, through
// testhook.SetFS or Options.fs); the default is osFS. It is testhook.FS,
// whose types are exported so that a package outside runstate can
// implement it. Locks are not part of it: they go through gofrs/flock.
type fileSystem = testhook.FS

// file is the part of *os.File that runstate uses. Sync makes the file's
// data durable, with the metadata needed to read it back (its size), but
// not its times: fdatasync(2) where the system has it. For an overwrite of
// bytes already allocated (logs/ledger.wal) that writes no metadata.
type file = testhook.File

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err // a nil *os.File must not become a non-nil file
	}
	return osFile{f}, nil
}

// osFile is an *os.File whose Sync is fdatasync where the system has one.
type osFile struct{ *os.File }

func (f osFile) Sync() error                              { return datasync(f.File) }
func (osFS) Rename(oldpath, newpath string) error         { return rename(oldpath, newpath) }
func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) MkdirAll(path string, perm fs.FileMode) error { return os.MkdirAll(path, perm) }
func (osFS) Stat(name string) (fs.FileInfo, error)        { return os.Stat(name) }
func (osFS) ReadDir(name string) ([]fs.DirEntry, error)   { return os.ReadDir(name) }
func (osFS) SyncDir(dir string) error                     { return syncDir(dir) }

// readFile reads the file name, which must be a regular file (a FIFO
// would block, a device such as /dev/zero never end) of limit bytes at
// most. Its errors name the file.
func readFile(fsys fileSystem, name string, limit int64) ([]byte, error) {
	f, fi, err := openRegularIn(fsys, name, os.O_RDONLY)
	if err != nil {
		if nr := (*notRegular)(nil); errors.As(err, &nr) {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return nil, err // names the file
	}
	defer f.Close()
	if fi.Size() > limit {
		return nil, tooLarge(name, fi.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	if int64(len(data)) > limit {
		return nil, tooLarge(name, int64(len(data)), limit)
	}
	return data, nil
}

// openRegularIn is openRegular of name in fsys. A name that is not a
// regular file by its stat (through a symbolic link, a device) is refused
// without being opened: a device may act on open (/dev/watchdog arms, a
// tape rewinds).
func openRegularIn(fsys fileSystem, name string, flag int) (file, fs.FileInfo, error) {
	if fi, err := fsys.Stat(name); err == nil && !fi.Mode().IsRegular() {
		return nil, nil, &notRegular{fi.Mode()}
	}
	return openRegular(flag, func(flag int) (file, error) { return fsys.OpenFile(name, flag, 0) })
}

func tooLarge(name string, n, limit int64) error {
	return fmt.Errorf("%w: %s is %d bytes or more, more than the %d bytes runstate reads of it: it is not a file runstate wrote; move it away",
		ErrInvalid, name, n, limit)
}

// tmpDir holds every temp file runstate creates. Temp files live in
// logs/tmp/ and are named <session>-<random>, so the next Open can
// remove those whose session is gone.
const tmpDir = "logs/tmp"

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}

// writeAtomic replaces path with data: a temp file created with O_EXCL in
// tmp (same file system), written, optionally synced, closed and renamed
// over path. With sync, the directory is synced too, so the new name is
// durable when writeAtomic returns. A failure leaves path as it was and no
// temp file behind.
func writeAtomic(fsys fileSystem, tmp, session, path string, data []byte, sync bool) error {
	return copyAtomic(fsys, tmp, session, path, bytes.NewReader(data), sync)
}

// copyAtomic is writeAtomic for what r holds, streamed (a whole ledger,
// for Repair's backup).
func copyAtomic(fsys fileSystem, tmp, session, path string, r io.Reader, sync bool) (err error) {
	name := filepath.Join(tmp, session+"-"+randomHex(8))
	f, err := fsys.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			fsys.Remove(name)
		}
	}()
	if _, err = io.Copy(f, r); err != nil {
		return err
	}
	if sync {
		if err = f.Sync(); err != nil {
			return err
		}
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = fsys.Rename(name, path); err != nil {
		return err
	}
	if sync {
		return fsys.SyncDir(filepath.Dir(path))
	}
	return nil
}

// saveTorn copies the ledger's bytes from..to (a torn tail, or bytes the
// journal replaces) aside to logs/ledger.jsonl.torn-<time> through a temp
// file, synced when sync is set, and returns that path. It does not cut
// them: the caller truncates the ledger its own way. It streams them, as
// a torn last line is not held to the line limit.
func saveTorn(fsys fileSystem, dir, session string, ledger file, from, to int64, sync bool) (string, error) {
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	torn := &exactReader{r: io.NewSectionReader(ledger, from, to-from), n: to - from}
	aside := lp + ".torn-" + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := copyAtomic(fsys, filepath.Join(dir, filepath.FromSlash(tmpDir)), session, aside, torn, sync); err != nil {
		return "", fmt.Errorf("runstate: save torn tail of %s to %s: %w", lp, aside, err)
	}
	return aside, nil
}

// exactReader reads r, which must hold n bytes: if it ends before, the
// read fails with io.ErrUnexpectedEOF.
type exactReader struct {
	r io.Reader
	n int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	k, err := e.r.Read(p)
	e.n -= int64(k)
	if err == io.EOF && e.n > 0 {
		err = io.ErrUnexpectedEOF
	}
	return k, err
}

// fileSize returns f's size without stat(2): it seeks to the end (reads
// use ReadAt and writes O_APPEND, so the offset is not used). A stat reads
// the file's times, and since Linux 6.13 that makes the next write to the
// file take a fine-grained time, so that every append updates the inode
// instead of one per clock tick: 1-2% of a checkpoint here (PERF.md).
func fileSize(f file) (int64, error) { return f.Seek(0, io.SeekEnd) }

// isNotExist reports whether err says a file does not exist.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }

func (osFS) Link(oldname, newname string) error { return os.Link(oldname, newname) }
