package runstate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"unicode/utf8"
)

// outputs is the Run's local directory, where stages' outputs live:
// Stage.WriteFile writes them, Stage.Output and Complete hash them, Begin
// and Verify check them against what the ledger recorded. Every path goes
// through an os.Root of the directory: no output escapes it, and none is
// one of runstate's own files (ownPath), also through a symbolic link.
type outputs struct {
	dir     string      // the directory as the Run was given it, for messages
	abs     string      // made absolute once
	root    *os.Root    // the directory: no path escapes it
	fast    outputDirs  // on Linux, the directories write works in
	perm    fs.FileMode // a new output's mode (the ledger's bits: pathguard)
	session string      // names temp files
	closing sync.Once
}

// openOutputs opens the local directory dir (which exists) for session,
// whose new outputs get mode perm.
func openOutputs(dir, session string, perm fs.FileMode) (*outputs, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("runstate: cannot use %s: %w", dir, err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("runstate: open %s: %w", dir, err)
	}
	o := &outputs{dir: dir, abs: abs, root: root, perm: perm, session: session}
	o.fast.open(root)
	return o, nil
}

// close closes the directory; a second call does nothing. A WriteFile
// or hash still under way fails on the closed descriptors (Stage.closedOr
// makes that ErrClosed): the fields stay as they are, so that it does not
// race with close.
func (o *outputs) close() {
	if o == nil {
		return
	}
	o.closing.Do(func() {
		o.root.Close()
		o.fast.close()
	})
}

// path returns rel inside the directory, absolute.
func (o *outputs) path(rel string) string { return filepath.Join(o.abs, filepath.FromSlash(rel)) }

// stat refuses, with the os.Root's error, a path that leads out of the
// directory; a missing file is nil. dir reports a directory there.
func (o *outputs) stat(rel string) (dir bool, err error) {
	fi, err := o.root.Stat(filepath.FromSlash(rel))
	if err != nil && !isNotExist(err) {
		return false, err
	}
	return err == nil && fi.IsDir(), nil
}

// rel checks that p names a file inside the run directory and returns it
// relative to the run directory, with forward slashes.
func (o *outputs) rel(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: empty output path", ErrInvalid)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%w: output path %q has a NUL byte, which no file system takes in a name", ErrInvalid, p)
	}
	if !utf8.ValidString(p) {
		// The ledger would record it altered (JSON), and a later session
		// would find the output missing and redo the stage every time.
		return "", fmt.Errorf("%w: output path %q is not valid UTF-8", ErrInvalid, p)
	}
	if filepath.IsAbs(p) {
		rel, err := filepath.Rel(o.abs, p)
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return "", fmt.Errorf("%w: output %s is outside the run directory %s", ErrInvalid, p, o.dir)
		}
		p = rel
	}
	p = filepath.ToSlash(filepath.Clean(p))
	if p == "." || p == ".." || strings.HasPrefix(p, "../") || !filepath.IsLocal(filepath.FromSlash(p)) {
		return "", fmt.Errorf("%w: output %s escapes the run directory %s", ErrInvalid, p, o.dir)
	}
	return p, checkOwnOrDevice(p)
}

// checkOwnOrDevice refuses an output path rel (clean, slash-separated,
// inside the run directory) that names one of runstate's own files, as
// any file system may read the name (ownPath), or a Windows device.
func checkOwnOrDevice(rel string) error {
	if ownPath(rel) {
		return fmt.Errorf("%w: output %s is one of runstate's own files (logs/ and manifest.json, in any case): write it elsewhere", ErrInvalid, rel)
	}
	if c := reservedName(rel); c != "" {
		return fmt.Errorf("%w: output %s: %q is a device name on Windows, not a file: choose another name", ErrInvalid, rel, c)
	}
	return nil
}

// CheckOutput reports whether rel, a path relative to a run directory
// (slash-separated, inside it), may name a stage's output there, by the
// rules that Stage.WriteFile and Stage.Output apply to the name: not one
// of runstate's own files (logs/ and manifest.json, in any case, nor by
// a name that Windows reads as one: MANIFE~1.JSO, a trailing dot, an
// NTFS stream), not a Windows device name. Symbolic links are checked
// when the output is recorded. The error wraps ErrInvalid. Tools that
// take an output path from a person check it with this before they open
// the run. It reads and writes nothing and is safe for concurrent use.
func CheckOutput(rel string) error {
	p := path.Clean(rel)
	if p != rel || !filepath.IsLocal(filepath.FromSlash(p)) {
		return fmt.Errorf("%w: output %q is not a clean path inside the run directory", ErrInvalid, rel)
	}
	return checkOwnOrDevice(p)
}

// write writes an output through the run's os.Root: a symbolic link
// that leads out of the run directory is refused.
func (o *outputs) write(rel string, data []byte) (err error) {
	name := o.session + "-" + randomHex(8)
	perm := o.perm
	if o.fast.write(rel, name, data, perm) {
		return nil
	}
	// os.Root follows a link inside the run: not one to runstate's files.
	if err := o.checkLanding(rel, false); err != nil {
		return err
	}
	return o.writeTemp(rel, name, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// writeFrom writes an output from what fill writes, through a temp file
// in logs/tmp renamed into place (blobs.go: an output fetched from the
// store). The caller checked rel's landing.
func (o *outputs) writeFrom(rel string, fill func(io.Writer) error) error {
	return o.writeTemp(rel, o.session+"-"+randomHex(8), fill)
}

// writeTemp writes rel through the temp file logs/tmp/name.
func (o *outputs) writeTemp(rel, name string, fill func(io.Writer) error) (err error) {
	perm := o.perm
	native := filepath.FromSlash(rel)
	tmp := filepath.Join(filepath.FromSlash(tmpDir), name)
	f, err := o.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("runstate: output %s: %w", rel, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			o.root.Remove(tmp)
		}
	}()
	if err = fill(f); err != nil {
		return fmt.Errorf("runstate: output %s: %w", rel, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("runstate: output %s: %w", rel, err)
	}
	err = o.root.Rename(tmp, native)
	if dir := filepath.Dir(native); err != nil && dir != "." && errors.Is(err, fs.ErrNotExist) {
		// The directory is made only when it is missing: a checkpoint
		// spends no system call on one that exists.
		if err = o.root.MkdirAll(dir, 0o755); err == nil {
			err = o.root.Rename(tmp, native)
		}
	}
	if err != nil {
		if fi, serr := o.root.Lstat(native); serr == nil && fi.IsDir() {
			return fmt.Errorf("%w: output %s is a directory: an output is a file: give a file's path (%s/NAME)", ErrInvalid, rel, rel)
		}
		return fmt.Errorf("runstate: output %s: %w", rel, err)
	}
	return nil
}

// checkOutputs hashes a done stage's recorded outputs and says which one
// is missing or altered, or "" when all are as recorded.
func (out *outputs) check(outs []Output) string {
	for _, o := range outs {
		sum, size, err := out.hashSized(o.Path, o.Size)
		switch {
		case isNotExist(err):
			return fmt.Sprintf("output %s missing", o.Path)
		case err != nil:
			if why := out.linkOut(o.Path); why != "" && !errors.As(err, new(*notRegular)) {
				return fmt.Sprintf("output %s unreadable: %s", o.Path, why)
			}
			return fmt.Sprintf("output %s unreadable: %v", o.Path, err)
		case size != o.Size:
			return fmt.Sprintf("output %s altered (%d bytes, want %d)", o.Path, size, o.Size)
		case sum != o.SHA256:
			return fmt.Sprintf("output %s altered (sha256:%.12s, want sha256:%.12s)", o.Path, sum, o.SHA256)
		}
	}
	return ""
}

// linkOut names, for an output rel that could not be opened (not for
// being no regular file), the first symbolic link on its path (the file
// or a directory) that leads out of the run: the directory's root
// follows none ("path escapes from parent"). It says what to do; "" when
// there is no such link (a link within the run is followed).
func (out *outputs) linkOut(rel string) string {
	parts := strings.Split(path.Clean(rel), "/")
	for i := range parts {
		p := filepath.Join(parts[:i+1]...)
		fi, err := out.root.Lstat(p)
		if err != nil {
			return ""
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			to, err := out.root.Readlink(p)
			if err != nil {
				return ""
			}
			if !filepath.IsAbs(to) && filepath.IsLocal(filepath.Join(filepath.Dir(p), to)) {
				continue // a link within the run (the root follows it): not the cause (a loop of them is named by the error itself)
			}
			return fmt.Sprintf("%s is a symbolic link (to %q) out of the run directory, which runstate does not follow: replace the link with what it points to", filepath.ToSlash(p), to)
		}
	}
	return ""
}

// hash returns the hex SHA-256 and the size of the regular file rel.
func (o *outputs) hash(rel string) (string, int64, error) { return o.hashSized(rel, -1) }

// hashSized is hash for a file expected to be size bytes (-1: any size):
// one of another size is not read (it may be huge, a sparse file of a
// terabyte), and its hash is "".
func (o *outputs) hashSized(rel string, size int64) (string, int64, error) {
	f, fi, err := openRegular(os.O_RDONLY, func(flag int) (*os.File, error) { return o.root.OpenFile(filepath.FromSlash(rel), flag, 0) })
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	if size >= 0 && fi.Size() != size {
		return "", fi.Size(), nil
	}
	h := sha256.New()
	n, err := copyFile(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// copyBufs are copyFile's buffers.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyFile copies f to w through a pooled buffer. io.Copy would take an
// *os.File's WriteTo, which (to a hash) copies through a new 32 KiB
// buffer: an allocation as large as the rest of a checkpoint's, for every
// output hashed.
func copyFile(w io.Writer, f io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(w, struct{ io.Reader }{f}, *bp)
}

// checkLanding refuses an output rel whose path, once the symbolic links
// on its way are followed, names runstate's own files (ownPath) or leads
// out of the run: os.Root keeps a link inside the run directory, but one
// to logs/ (or to the run directory itself, then manifest.json) is inside
// too. With final, rel's last component is followed as well (an output
// that Output declares is read through it); without, it is not (WriteFile
// replaces it). Where no directory on the way is a link, it costs one
// lstat per directory level.
func (o *outputs) checkLanding(rel string, final bool) error {
	return o.landing(rel, rel, final, 0)
}

func (o *outputs) landing(orig, rel string, final bool, depth int) error {
	p := rel
	if !final {
		p = path.Dir(rel)
	}
	if p == "." {
		return nil
	}
	// The first component that is a link, if any.
	var link string
	for i := 0; ; {
		j := strings.IndexByte(p[i:], '/')
		prefix := p
		if j >= 0 {
			prefix = p[:i+j]
		}
		fi, err := os.Lstat(o.path(prefix))
		if err != nil {
			return nil // missing: what follows is made as real directories
		}
		if fi.Mode()&(fs.ModeSymlink|fs.ModeIrregular) != 0 {
			link = prefix
			break
		}
		if j < 0 {
			return nil
		}
		i += j + 1
	}
	if depth > 40 {
		return fmt.Errorf("%w: output %s: too many symbolic links on the way", ErrInvalid, orig)
	}
	top, err := filepath.EvalSymlinks(o.dir)
	if err != nil {
		return fmt.Errorf("runstate: output %s: %w", orig, err)
	}
	to, err := filepath.EvalSymlinks(o.path(link))
	if err != nil {
		return fmt.Errorf("%w: output %s: %s is a symbolic link that cannot be followed (%v): outputs must stay inside the run directory %s", ErrInvalid, orig, link, err, o.dir)
	}
	in, err := filepath.Rel(top, to)
	if err != nil || !filepath.IsLocal(in) && in != "." {
		return fmt.Errorf("%w: output %s leads out of the run directory %s through the symbolic link %s", ErrInvalid, orig, o.dir, link)
	}
	now := path.Join(filepath.ToSlash(in), strings.TrimPrefix(rel, link))
	if ownPath(now) {
		return fmt.Errorf("%w: output %s is %s through the symbolic link %s, one of runstate's own files: write it elsewhere, or replace the link", ErrInvalid, orig, now, link)
	}
	return o.landing(orig, now, final, depth+1)
}
