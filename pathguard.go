package runstate

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Where runstate's writes may land.
//
// runstate's own files are at fixed names (ownEntries). Open and Repair
// refuse a run where one of them is a symbolic link (or a FIFO, a device),
// naming it, so that a write or a truncation never lands outside the run
// or on another file (guardOwnFiles). An output's path may not name one of
// them, in any spelling a file system takes for the same name (ownPath),
// and a symbolic link on its way is followed and the path checked again
// (checkLanding). The threat is a mistake or a planted link in the run
// directory, not a hostile process that writes there while runstate runs:
// a link made between the check and the write is not caught.

// ownEntries are runstate's own files and directories at fixed names.
// The others are made with O_EXCL (temp files), named after a new session
// (session locks, handoff files) or by the time (torn tails, backups), so
// no link can wait for them.
var ownEntries = []string{"logs", sessionsDir, tmpDir, handoffDir,
	ledgerFile, walFile, lockFile, nextStepsFile, manifestFile}

// guardOwnFiles checks runstate's own files in dir before anything opens
// them: none may be a symbolic link, and none that is a
// file may be a FIFO, a device or a socket (opening one blocks, or writes
// elsewhere).
func guardOwnFiles(dir string) error {
	for _, rel := range ownEntries {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		fi, err := os.Lstat(p)
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("runstate: cannot use %s: %w", p, err)
		}
		t := fi.Mode().Type()
		switch {
		case t&fs.ModeSymlink != 0:
			to, _ := os.Readlink(p)
			return fmt.Errorf("%w: %s is a symbolic link (to %q): runstate opens its own files only where they are, so that no write or repair lands outside the run or on another file; replace the link with what it points to (or move the run there), then run again",
				ErrInvalid, p, to)
		case t&(fs.ModeNamedPipe|fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket) != 0:
			return fmt.Errorf("%w: %s is %s, not runstate's file: move it away, then run again", ErrInvalid, p, kindOf(fi.Mode()))
		}
	}
	return nil
}

// kindOf names what a file that is not a regular one is.
func kindOf(m fs.FileMode) string {
	switch t := m.Type(); {
	case t&fs.ModeNamedPipe != 0:
		return "a named pipe (FIFO)"
	case t&fs.ModeCharDevice != 0, t&fs.ModeDevice != 0:
		return "a device"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "not a regular file"
}

// guard checks the run's own files before Open uses them (guardOwnFiles).
func (r *Run) guard() error { return guardOwnFiles(r.dir) }

// ownPath reports whether rel (clean, slash-separated, relative to the run
// directory) names runstate's own files, logs/ or anything in it or
// manifest.json, as any file system runstate may run on reads the name:
// without case (macOS, Windows: LOGS/ledger.jsonl, Manifest.JSON), without
// trailing dots and spaces, an NTFS stream (manifest.json::$DATA) or the
// short name (MANIFE~1.JSO) (Windows).
func ownPath(rel string) bool {
	first, _, nested := strings.Cut(rel, "/")
	first = windowsName(first)
	if strings.EqualFold(first, "logs") {
		return true
	}
	if nested {
		return false
	}
	up := strings.ToUpper(first)
	return up == "MANIFEST.JSON" || strings.HasPrefix(up, "MANIFE~") && strings.HasSuffix(up, ".JSO")
}

// windowsName is the name Windows opens for the path component c: without
// an NTFS stream suffix and trailing dots and spaces.
func windowsName(c string) string {
	if i := strings.IndexByte(c, ':'); i >= 0 {
		c = c[:i]
	}
	return strings.TrimRight(c, ". ")
}

// reservedName returns the first component of rel that Windows takes for
// a device (NUL, CON, COM1, LPT1.txt...), or "". Such an output could not
// be written or read back on Windows, where it is a device, not a file, so
// it is refused everywhere: a run directory works on every system.
func reservedName(rel string) string {
	for c := range strings.SplitSeq(rel, "/") {
		base, _, _ := strings.Cut(windowsName(c), ".")
		up := strings.ToUpper(strings.TrimRight(base, " "))
		switch up {
		case "CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$":
			return c
		}
		if len(up) > 3 && (up[:3] == "COM" || up[:3] == "LPT") {
			switch up[3:] {
			case "1", "2", "3", "4", "5", "6", "7", "8", "9", "\u00b9", "\u00b2", "\u00b3":
				return c
			}
		}
	}
	return ""
}

// checkLanding refuses an output rel whose path, once the symbolic links
// on its way are followed, names runstate's own files (ownPath) or leads
// out of the run: os.Root keeps a link inside the run directory, but one
// to logs/ (or to the run directory itself, then manifest.json) is inside
// too. With final, rel's last component is followed as well (an output
// that Output declares is read through it); without, it is not (WriteFile
// replaces it). Where no directory on the way is a link, it costs one
// lstat per directory level.
func (r *Run) checkLanding(rel string, final bool) error {
	return r.landing(rel, rel, final, 0)
}

func (r *Run) landing(orig, rel string, final bool, depth int) error {
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
		fi, err := os.Lstat(r.path(prefix))
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
	top, err := filepath.EvalSymlinks(r.dir)
	if err != nil {
		return fmt.Errorf("runstate: output %s: %w", orig, err)
	}
	to, err := filepath.EvalSymlinks(r.path(link))
	if err != nil {
		return fmt.Errorf("%w: output %s: %s is a symbolic link that cannot be followed (%v): outputs must stay inside the run directory %s", ErrInvalid, orig, link, err, r.dir)
	}
	in, err := filepath.Rel(top, to)
	if err != nil || !filepath.IsLocal(in) && in != "." {
		return fmt.Errorf("%w: output %s leads out of the run directory %s through the symbolic link %s", ErrInvalid, orig, r.dir, link)
	}
	now := path.Join(filepath.ToSlash(in), strings.TrimPrefix(rel, link))
	if ownPath(now) {
		return fmt.Errorf("%w: output %s is %s through the symbolic link %s, one of runstate's own files: write it elsewhere, or replace the link", ErrInvalid, orig, now, link)
	}
	return r.landing(orig, now, final, depth+1)
}

// openRegular opens a file to hash it (an input, an output) with open,
// without blocking on a FIFO, and refuses one that is not a regular file
// (a FIFO, a device such as /dev/zero, a directory) with a *notRegular:
// hashing it would block or never end.
func openRegular(open func(flag int) (*os.File, error)) (*os.File, error) {
	f, err := open(os.O_RDONLY | oNonblock)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &notRegular{fi.Mode()}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// notRegular says that a file to hash is not a regular file. It wraps
// ErrInvalid.
type notRegular struct{ mode fs.FileMode }

func (e *notRegular) Error() string { return kindOf(e.mode) + ", not a regular file" }
func (e *notRegular) Unwrap() error { return ErrInvalid }
