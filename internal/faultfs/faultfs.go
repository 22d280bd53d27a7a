// Package faultfs is a file system for runstate's tests that injects
// faults: errors such as ENOSPC, EIO and EROFS on chosen operations, short
// writes, and a power loss that drops every write and directory entry not
// yet made durable. It implements testhook.FS over the operating system's
// files; package runstate takes it through testhook.SetFS.
//
// The power-loss model: a file's durable content is what it held at its
// last Sync; a name in a directory is durable once the directory was
// synced after the name was created, renamed or removed (a file that
// existed before the FS first saw it counts as durable, as it is); a
// directory that MkdirAll created is durable once its parent was synced.
// PowerLoss rewrites the disk to that durable state, or (PowerLoss with a
// rand, PowerLossSectors) to one that keeps some of the rest: a prefix of
// what a file grew by, or sector by sector what a disk may leave of
// writes it was not asked to make durable. Files that runstate
// writes without the seam (outputs through os.Root, lock files) are left
// as they are, unless a directory above them was never made durable.
package faultfs

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/runstate/runstate/internal/testhook"
)

// Op names an operation a Rule applies to.
type Op string

// The operations.
const (
	OpOpen     Op = "open"     // OpenFile (any flags)
	OpCreate   Op = "create"   // OpenFile that may create or write
	OpWrite    Op = "write"    // File.Write
	OpSync     Op = "sync"     // File.Sync
	OpTruncate Op = "truncate" // File.Truncate
	OpRename   Op = "rename"   // Rename (Path matches the new name)
	OpLink     Op = "link"     // Link (Path matches the new name)
	OpRemove   Op = "remove"   // Remove
	OpMkdir    Op = "mkdir"    // MkdirAll that has a directory to create
	OpSyncDir  Op = "syncdir"  // SyncDir
)

// Rule injects a fault into the matching calls.
type Rule struct {
	Op    Op
	Path  string // the call's path must end with it ("" matches any)
	Err   error  // what the call returns
	Short int    // OpWrite: bytes written before the error (-1: half)
	After int    // matching calls to let through first
	Times int    // faults to inject; 0 means every matching call after After
}

// FS is a fault-injecting file system. Safe for concurrent use.
type FS struct {
	mu       sync.Mutex
	rules    []*Rule
	calls    map[string]int // op + " " + path -> calls
	files    map[string]*inode
	durable  map[string]*inode // the durable namespace
	newDirs  map[string]bool   // created by MkdirAll, entry not durable yet
	epoch    int               // PowerLosses so far: older handles are dead
	nextIno  int
	readOnly bool
}

type inode struct {
	id     int
	synced []byte // durable content
}

// New returns a file system with no faults.
func New() *FS {
	return &FS{calls: map[string]int{}, files: map[string]*inode{}, durable: map[string]*inode{}, newDirs: map[string]bool{}}
}

// Inject adds a rule.
func (f *FS) Inject(r Rule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, &r)
}

// Clear removes every rule and the read-only mode.
func (f *FS) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
	f.readOnly = false
}

// ReadOnly makes every call that would change the disk fail with EROFS,
// as on a file system mounted read-only: opening a file for writing,
// creating, renaming, removing, making a directory that does not exist.
func (f *FS) ReadOnly() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readOnly = true
}

// Calls returns how many times op was called on a path ending with suffix.
func (f *FS) Calls(op Op, suffix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, c := range f.calls {
		o, p, _ := strings.Cut(k, " ")
		if Op(o) == op && strings.HasSuffix(p, suffix) {
			n += c
		}
	}
	return n
}

// fault counts the call and returns the rule that fires for it, if any.
// The caller holds f.mu.
func (f *FS) fault(op Op, path string) *Rule {
	f.calls[string(op)+" "+filepath.ToSlash(path)]++
	for _, r := range f.rules {
		if r.Op != op || !strings.HasSuffix(filepath.ToSlash(path), r.Path) {
			continue
		}
		if r.After > 0 {
			r.After--
			continue
		}
		if r.Times < 0 {
			continue // spent
		}
		if r.Times > 0 {
			r.Times--
			if r.Times == 0 {
				r.Times = -1
			}
		}
		return r
	}
	return nil
}

func pathErr(op, path string, err error) error { return &fs.PathError{Op: op, Path: path, Err: err} }

func writes(flag int) bool {
	return flag&(os.O_WRONLY|os.O_RDWR|os.O_CREATE|os.O_TRUNC|os.O_APPEND) != 0
}

// OpenFile opens name as os.OpenFile does.
func (f *FS) OpenFile(name string, flag int, perm fs.FileMode) (testhook.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.fault(OpOpen, name); r != nil {
		return nil, pathErr("open", name, r.Err)
	}
	if writes(flag) {
		if r := f.fault(OpCreate, name); r != nil {
			return nil, pathErr("open", name, r.Err)
		}
		if f.readOnly {
			return nil, pathErr("open", name, syscall.EROFS)
		}
	}
	_, statErr := os.Stat(name)
	existed := statErr == nil
	osf, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	ino := f.files[name]
	switch {
	case ino == nil && existed:
		ino = f.adopt(name)
	case ino == nil:
		f.nextIno++
		ino = &inode{id: f.nextIno}
		f.files[name] = ino
	}
	return &File{f: osf, fs: f, name: name, ino: ino, epoch: f.epoch}, nil
}

// adopt takes a file the FS has not seen as durable, as it is. The caller
// holds f.mu.
func (f *FS) adopt(name string) *inode {
	data, _ := os.ReadFile(name)
	f.nextIno++
	ino := &inode{id: f.nextIno, synced: data}
	f.files[name] = ino
	f.durable[name] = ino
	return ino
}

// Rename renames as os.Rename does.
func (f *FS) Rename(oldpath, newpath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.fault(OpRename, newpath); r != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: r.Err}
	}
	if f.readOnly {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: syscall.EROFS}
	}
	if f.files[newpath] == nil {
		if _, err := os.Stat(newpath); err == nil {
			f.adopt(newpath)
		}
	}
	ino := f.files[oldpath]
	if ino == nil {
		ino = f.adopt(oldpath)
	}
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	delete(f.files, oldpath)
	f.files[newpath] = ino
	return nil
}

// Link makes newname a hard link to oldname, as os.Link does. The new name
// is durable once its directory is synced.
func (f *FS) Link(oldname, newname string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.fault(OpLink, newname); r != nil {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: r.Err}
	}
	if f.readOnly {
		return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: syscall.EROFS}
	}
	ino := f.files[oldname]
	if ino == nil {
		ino = f.adopt(oldname)
	}
	if err := os.Link(oldname, newname); err != nil {
		return err
	}
	f.files[newname] = ino
	return nil
}

// Remove removes as os.Remove does.
func (f *FS) Remove(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.fault(OpRemove, name); r != nil {
		return pathErr("remove", name, r.Err)
	}
	if f.readOnly {
		return pathErr("remove", name, syscall.EROFS)
	}
	if f.files[name] == nil {
		if fi, err := os.Stat(name); err == nil && !fi.IsDir() {
			f.adopt(name)
		}
	}
	if err := os.Remove(name); err != nil {
		return err
	}
	delete(f.files, name)
	return nil
}

// MkdirAll makes directories as os.MkdirAll does; those it creates are
// not durable until their parent is synced.
func (f *FS) MkdirAll(path string, perm fs.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var missing []string
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if r := f.fault(OpMkdir, path); r != nil {
		return pathErr("mkdir", path, r.Err)
	}
	if f.readOnly {
		return pathErr("mkdir", path, syscall.EROFS)
	}
	if err := os.MkdirAll(path, perm); err != nil {
		return err
	}
	for _, p := range missing {
		f.newDirs[p] = true
	}
	return nil
}

// Stat is os.Stat.
func (f *FS) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }

// ReadDir is os.ReadDir.
func (f *FS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(name) }

// SyncDir makes the entries of dir durable: the files named in it now,
// the removal of those no longer there, and the directories created in it.
func (f *FS) SyncDir(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.fault(OpSyncDir, dir); r != nil {
		return pathErr("sync", dir, r.Err)
	}
	dir = filepath.Clean(dir)
	for p, ino := range f.files {
		if filepath.Dir(p) == dir {
			f.durable[p] = ino
		}
	}
	for p := range f.durable {
		if filepath.Dir(p) == dir && f.files[p] == nil {
			delete(f.durable, p)
		}
	}
	for p := range f.newDirs {
		if filepath.Dir(p) == dir {
			delete(f.newDirs, p)
		}
	}
	return nil
}

// Durable reports whether path would survive a power loss now, with the
// content it would have.
func (f *FS) Durable(path string) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ino := f.durable[path]
	if ino == nil || f.underNewDir(path) {
		return nil, false
	}
	return append([]byte(nil), ino.synced...), true
}

func (f *FS) underNewDir(path string) bool {
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		if f.newDirs[p] {
			return true
		}
		if filepath.Dir(p) == p {
			return false
		}
	}
}

// PowerLoss rewrites the disk as a power loss would leave it: every file
// the FS knows gets its durable content, or disappears when its name was
// never made durable (a name removed but not synced comes back), and every
// directory whose entry was never made durable disappears with what is in
// it. Handles opened before fail from then on. Crash the runs that use
// the FS first, so that nothing writes meanwhile.
//
// With torn set, a disk wrote some of its queued blocks (see tear): a
// file whose content grew since its last sync keeps a random prefix of
// the unsynced bytes instead of none, and each 512-byte sector overwritten
// since the last sync keeps its old or its new bytes (rng picks).
func (f *FS) PowerLoss(torn *rand.Rand) error {
	if torn == nil {
		return f.powerLoss(nil)
	}
	return f.powerLoss(func(synced, cur []byte) []byte { return tear(synced, cur, torn) })
}

// PowerLossSectors is PowerLoss under the whole model of what a disk may
// do with writes it was never asked to make durable (the model
// hashicorp/raft-wal states): each sector (sector bytes, 512 or 4096)
// that holds bytes written since the file's last sync keeps them, loses
// them, holds zeros there, or holds garbage there, in any order along the
// file; rng picks, one in four each, so a seed reproduces a loss. A lost
// sector of what the file grew by ends the file there (its new size never
// reached the disk); a lost sector of bytes overwritten in place keeps
// the old bytes. A hole, zeros or garbage followed by sectors that were
// kept is what an fdatasync'd-later ledger may read as mid-file damage.
// Bytes that were synced are never changed: a disk that loses those
// breaks every log. A file cut shorter since its sync may keep its old
// length (rng picks).
func (f *FS) PowerLossSectors(rng *rand.Rand, sector int) error {
	return f.powerLoss(func(synced, cur []byte) []byte { return shatter(synced, cur, rng, sector) })
}

// powerLoss is PowerLoss with damage choosing what is left of a file
// whose durable content is synced and whose content now is cur; nil
// damage leaves synced.
func (f *FS) powerLoss(damage func(synced, cur []byte) []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	names := map[string]bool{}
	for p := range f.files {
		names[p] = true
	}
	for p := range f.durable {
		names[p] = true
	}
	sorted := make([]string, 0, len(names))
	for p := range names {
		sorted = append(sorted, p)
	}
	sort.Strings(sorted)
	for _, p := range sorted {
		ino := f.durable[p]
		if ino == nil || f.underNewDir(p) {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		data := ino.synced
		if damage != nil {
			if cur, err := os.ReadFile(p); err == nil {
				data = damage(data, cur)
			}
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			errs = append(errs, err)
		}
		ino.synced = data
	}
	dirs := make([]string, 0, len(f.newDirs))
	for p := range f.newDirs {
		dirs = append(dirs, p)
	}
	sort.Strings(dirs)
	for _, p := range dirs {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	f.files = map[string]*inode{}
	for p, ino := range f.durable {
		if !f.underNewDir(p) {
			f.files[p] = ino
		}
	}
	f.durable = map[string]*inode{}
	for p, ino := range f.files {
		f.durable[p] = ino
	}
	f.newDirs = map[string]bool{}
	f.epoch++
	if len(errs) > 0 {
		return fmt.Errorf("faultfs: power loss: %w", errors.Join(errs...))
	}
	return nil
}

// sector is the unit a disk writes whole, or not at all.
const sector = 512

// tear is what a power loss may leave of a file whose durable content is
// synced and whose content now is cur: each sector overwritten since the
// sync holds its old or its new bytes (rng picks), and when the file grew
// with its old bytes in place, a random prefix of the growth survives.
func tear(synced, cur []byte, rng *rand.Rand) []byte {
	out := append([]byte(nil), synced...)
	n := min(len(synced), len(cur))
	same := true
	for s := 0; s < n; s += sector {
		e := min(s+sector, n)
		if string(cur[s:e]) != string(synced[s:e]) {
			same = false
			if rng.IntN(2) == 0 {
				copy(out[s:e], cur[s:e])
			}
		}
	}
	if same && len(cur) > len(synced) {
		out = cur[:len(synced)+rng.IntN(len(cur)-len(synced)+1)]
	}
	return out
}

// The fates of a sector of unsynced bytes (shatter).
const (
	sectorKept = iota
	sectorLost
	sectorZeroed
	sectorGarbled
)

// shatter is what PowerLossSectors leaves of a file whose durable content
// is synced and whose content now is cur: each sector of size sector
// that holds bytes that differ from synced, or that the file grew by,
// meets a fate rng picks for its unsynced bytes (kept, lost, zeroed,
// garbled); synced bytes stay.
func shatter(synced, cur []byte, rng *rand.Rand, sector int) []byte {
	if sector <= 0 {
		sector = 512
	}
	out := append([]byte(nil), cur...)
	unsynced := func(i int) bool { return i >= len(synced) || cur[i] != synced[i] }
	for s := 0; s < len(cur); s += sector {
		e := min(s+sector, len(cur))
		dirty := false
		for i := s; i < e && !dirty; i++ {
			dirty = unsynced(i)
		}
		if !dirty {
			continue
		}
		fate := rng.IntN(4)
		for i := s; i < e; i++ {
			if !unsynced(i) {
				continue
			}
			switch fate {
			case sectorLost:
				if i < len(synced) {
					out[i] = synced[i]
				}
			case sectorZeroed:
				out[i] = 0
			case sectorGarbled:
				out[i] = byte(rng.Uint32())
			}
		}
		if fate == sectorLost && e > len(synced) {
			return out[:max(s, len(synced))] // the new size never reached the disk
		}
	}
	if len(cur) < len(synced) && rng.IntN(2) == 0 {
		out = append(out, synced[len(cur):]...) // the cut never reached the disk
	}
	return out
}

// File is a file opened through FS.
type File struct {
	f     *os.File
	fs    *FS
	name  string
	ino   *inode
	epoch int
}

// errLost is what a handle opened before a power loss returns.
var errLost = errors.New("faultfs: handle from before the power loss")

func (h *File) check() error {
	if h.epoch != h.fs.epoch {
		return errLost
	}
	return nil
}

// Read is os.File.Read.
func (h *File) Read(p []byte) (int, error) { return h.f.Read(p) }

// ReadAt is os.File.ReadAt.
func (h *File) ReadAt(p []byte, off int64) (int, error) { return h.f.ReadAt(p, off) }

// Write writes p, or fails as a rule says: with a short write, the first
// bytes reach the file before the error.
func (h *File) Write(p []byte) (int, error) { return h.write(p, h.f.Write) }

// WriteAt writes p at off, or fails as a rule says (OpWrite), as Write.
func (h *File) WriteAt(p []byte, off int64) (int, error) {
	return h.write(p, func(b []byte) (int, error) { return h.f.WriteAt(b, off) })
}

// write is Write and WriteAt: do writes, unless a rule fires.
func (h *File) write(p []byte, do func([]byte) (int, error)) (int, error) {
	h.fs.mu.Lock()
	if err := h.check(); err != nil {
		h.fs.mu.Unlock()
		return 0, err
	}
	r := h.fs.fault(OpWrite, h.name)
	h.fs.mu.Unlock()
	if r == nil {
		return do(p)
	}
	n := r.Short
	if n < 0 {
		n = len(p) / 2
	}
	n = min(n, len(p))
	if n > 0 {
		if m, err := do(p[:n]); err != nil {
			return m, err
		}
	}
	return n, pathErr("write", h.name, r.Err)
}

// Sync makes the file's content durable, or fails as a rule says (the
// content is then not durable).
func (h *File) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check(); err != nil {
		return err
	}
	if r := h.fs.fault(OpSync, h.name); r != nil {
		return pathErr("sync", h.name, r.Err)
	}
	// The content now: read it through the name the inode has.
	for p, ino := range h.fs.files {
		if ino == h.ino {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			ino.synced = data
			return nil
		}
	}
	return nil // unlinked: nothing durable to update
}

// Truncate is os.File.Truncate, or fails as a rule says.
func (h *File) Truncate(size int64) error {
	h.fs.mu.Lock()
	if err := h.check(); err != nil {
		h.fs.mu.Unlock()
		return err
	}
	r := h.fs.fault(OpTruncate, h.name)
	h.fs.mu.Unlock()
	if r != nil {
		return pathErr("truncate", h.name, r.Err)
	}
	return h.f.Truncate(size)
}

// Seek is os.File.Seek.
func (h *File) Seek(offset int64, whence int) (int64, error) { return h.f.Seek(offset, whence) }

// Stat is os.File.Stat.
func (h *File) Stat() (fs.FileInfo, error) { return h.f.Stat() }

// Close is os.File.Close.
func (h *File) Close() error { return h.f.Close() }

var _ testhook.FS = (*FS)(nil)
