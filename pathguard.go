package runstate

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Where runstate's writes may land, and with which permission bits.
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
	ledgerFile, walFile, lockFile, nextStepsFile, manifestFile, WorkDirFile}

// guardOwnFiles checks runstate's own files in dir before anything opens
// them: none may be a symbolic link, none that is a
// file may be a FIFO, a device or a socket (opening one blocks, or writes
// elsewhere), and the journal, overwritten in place, may have no other
// hard link. It returns the mode the run's files get: the ledger's
// group and other bits, so that a run made private with chmod stays so
// (0o777, no change, for a new run and on Windows). Files of runstate's
// that are more open than the ledger are brought to its bits, and said
// so in log (which may be nil).
func guardOwnFiles(dir string, log *slog.Logger) (fs.FileMode, error) {
	mode := fs.FileMode(0o777)
	for _, rel := range ownEntries {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		fi, err := os.Lstat(p)
		if isNotExist(err) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("runstate: cannot use %s: %w", p, err)
		}
		if err := ownEntryError(p, rel, fi); err != nil {
			return 0, err
		}
		if rel == walFile && linkCount(fi) > 1 {
			// Overwritten in place: through a hard link, that would
			// overwrite a file elsewhere (a copy made with cp -al, or any
			// file outside the run).
			return 0, fmt.Errorf("%w: %s has %d hard links: runstate overwrites it in place, which would change the other names' file too; give it a file of its own (cp %s %s.copy && mv %s.copy %s), then run again",
				ErrInvalid, p, linkCount(fi), p, p, p, p)
		}
		if rel == ledgerFile && fi.Mode().IsRegular() && runtime.GOOS != "windows" {
			mode = 0o700 | fi.Mode().Perm()&0o077
		}
	}
	if mode != 0o777 {
		tighten(dir, mode, log)
	}
	return mode, nil
}

// ownDirs are the entries of ownEntries that are directories.
var ownDirs = map[string]string{
	"logs":      "the ledger and its other files",
	sessionsDir: "the open sessions' lock files",
	tmpDir:      "the temp files of atomic writes",
	handoffDir:  "the open sessions' copies of next-steps.txt",
}

// ownEntryError is why runstate may not use what fi (from Lstat) says is
// at p, its own entry rel (one of ownEntries), as its own; nil when it
// may. Writers (guardOwnFiles) and readers (openOwn) both refuse a
// symbolic link, so that no write, repair or read goes outside the run
// or to another file; a FIFO, a device or a socket, which blocks or acts
// on open; a file where runstate keeps a directory, and a directory
// where it keeps a file other than a projection. Each error names p, says what is there and what
// to do, and wraps ErrInvalid.
func ownEntryError(p, rel string, fi fs.FileInfo) error {
	t := fi.Mode().Type()
	_, isDir := ownDirs[rel]
	switch {
	case t&fs.ModeSymlink != 0:
		to, _ := os.Readlink(p)
		return &ownFileError{fmt.Sprintf("%v: %s is a symbolic link (to %q): runstate reads and writes its own files only where they are, so that no read, write or repair goes outside the run or to another file; replace the link with what it points to (or move the run there), then run again",
			ErrInvalid, p, to)}
	case t&(fs.ModeNamedPipe|fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket) != 0:
		return &ownFileError{fmt.Sprintf("%v: %s is %s, not runstate's file: move it away, then run again", ErrInvalid, p, kindOf(fi.Mode()))}
	case isDir && fi.Mode().IsRegular():
		// Not any non-directory: Windows reports some directories (a
		// mount point, a cloud-synced folder) as irregular, not as ones.
		return &ownFileError{fmt.Sprintf("%v: %s is a file, not a directory: runstate keeps %s in it; move it away (runstate creates the directory), then run again",
			ErrInvalid, p, ownDirs[rel])}
	case !isDir && fi.IsDir() && rel != manifestFile && rel != nextStepsFile:
		// A projection that is a directory is not written, and Open
		// says so in the log: the run works without it.
		return &ownFileError{fmt.Sprintf("%v: %s is a directory, not runstate's file: move it away, then run again", ErrInvalid, p)}
	}
	return nil
}

// ownFileError is ownEntryError's error: one of runstate's own names holds
// what runstate does not use as its own. It wraps ErrInvalid.
type ownFileError struct{ msg string }

func (e *ownFileError) Error() string { return e.msg }
func (e *ownFileError) Unwrap() error { return ErrInvalid }

// notOwnFile reports whether err says that one of runstate's own names
// holds something Open refuses (ownFileError), or that is not a regular
// file (notRegular): a link, a FIFO, a directory.
func notOwnFile(err error) bool {
	return errors.As(err, new(*ownFileError)) || errors.As(err, new(*notRegular))
}

// openOwn opens runstate's own file rel (one of ownEntries) of the run in
// dir as openRegularIn opens a file, but only where it is: a symbolic link
// at its name or at logs/ is refused without being followed, as Open
// refuses it (ownEntryError), and so is a logs/ that is a file.
// The readers (Inspect, NextSteps, ReadLedger, Verify) open runstate's
// files through it, so that a run directory whose logs/ledger.jsonl links
// to /etc/shadow, or whose logs/ links to a file system that never
// answers, is not a way to make them read outside the run or hang; the
// writers refused such a run at Open (guardOwnFiles) and go through it
// too. Errors name the file.
func openOwn(fsys fileSystem, dir, rel string, flag int) (file, fs.FileInfo, error) {
	if err := ownNotLinked(dir, rel); err != nil {
		return nil, nil, err
	}
	return openRegularIn(fsys, filepath.Join(dir, filepath.FromSlash(rel)), flag|oNoFollow)
}

// readOwn is readFile of runstate's own file rel of the run in dir, read
// only where it is (openOwn).
func readOwn(fsys fileSystem, dir, rel string, limit int64) ([]byte, error) {
	if err := ownNotLinked(dir, rel); err != nil {
		return nil, err
	}
	return readFile(fsys, filepath.Join(dir, filepath.FromSlash(rel)), limit)
}

// ownNotLinked is the error for runstate's own file rel of the run in dir
// when it, or logs/ on the way to it, is a symbolic link, or logs/ is a
// file (ownEntryError); nil otherwise, a missing one included (an
// open says so).
func ownNotLinked(dir, rel string) error {
	steps := []string{rel}
	if strings.HasPrefix(rel, "logs/") {
		steps = []string{"logs", rel}
	}
	for _, r := range steps {
		p := filepath.Join(dir, filepath.FromSlash(r))
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		if fi.Mode().Type()&fs.ModeSymlink != 0 || (r != rel && fi.Mode().IsRegular()) {
			return ownEntryError(p, r, fi)
		}
	}
	return nil
}

// tighten brings runstate's files in dir (the projections, the journal,
// the handoff files, torn tails and backups of the ledger) down to mode
// where they have more bits: a ledger made private keeps its copies
// private. A file it cannot change stays as it was, and so does one with
// a hard link outside the files it looks at (its mode is that of a file
// elsewhere too, perhaps outside the run; runstate's own links are
// logs/next-steps.txt and a session's file in logs/handoff).
func tighten(dir string, mode fs.FileMode, log *slog.Logger) {
	var paths []string
	for _, d := range []string{"logs", handoffDir} {
		ents, _ := os.ReadDir(filepath.Join(dir, filepath.FromSlash(d)))
		for _, e := range ents {
			if e.Type().IsRegular() {
				paths = append(paths, filepath.Join(dir, filepath.FromSlash(d), e.Name()))
			}
		}
	}
	paths = append(paths, filepath.Join(dir, manifestFile))
	infos := make([]fs.FileInfo, len(paths))
	links := map[fileKey]uint64{} // how many of paths name each file
	for i, p := range paths {
		if fi, err := os.Lstat(p); err == nil {
			infos[i] = fi
			if k, ok := fileKeyOf(fi); ok {
				links[k]++
			}
		}
	}
	for i, p := range paths {
		fi := infos[i]
		if fi == nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&^mode == 0 {
			continue
		}
		if n := linkCount(fi); n > 1 {
			if k, ok := fileKeyOf(fi); !ok || links[k] < n {
				continue // linked from elsewhere
			}
		}
		if err := os.Chmod(p, fi.Mode().Perm()&mode); err == nil && log != nil {
			log.Info("runstate: made a file as private as the ledger", "file", p, "mode", fi.Mode().Perm()&mode)
		}
	}
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

// guard checks the run's own files before Open uses them (guardOwnFiles)
// and makes every file the Run creates through its file system get the
// ledger's permission bits.
func (s *dirStore) guard() error {
	mode, err := guardOwnFiles(s.dir, s.log)
	if err != nil {
		return err
	}
	s.fs = withMode(s.fs, mode)
	return nil
}

// fileKey identifies a file: its device and inode numbers.
type fileKey struct{ dev, ino uint64 }

// modeFS is a fileSystem whose new files get at most mode's bits.
type modeFS struct {
	fileSystem
	mode fs.FileMode
}

func (m modeFS) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	if flag&os.O_CREATE != 0 {
		perm &= m.mode
	}
	return m.fileSystem.OpenFile(name, flag, perm)
}

// modeLinkFS is a modeFS of a file system that makes hard links.
type modeLinkFS struct {
	modeFS
	l linker
}

func (m modeLinkFS) Link(oldname, newname string) error { return m.l.Link(oldname, newname) }

// withMode returns fsys with new files limited to mode (fsys itself for
// 0o777).
func withMode(fsys fileSystem, mode fs.FileMode) fileSystem {
	if mode == 0o777 {
		return fsys
	}
	m := modeFS{fsys, mode}
	if l, ok := fsys.(linker); ok {
		return modeLinkFS{m, l}
	}
	return m
}

// outputPerm is the mode a new output gets: 0o644 (less the umask), less
// what the run's files may not have.
func outputPerm(fsys fileSystem) fs.FileMode {
	switch m := fsys.(type) {
	case modeFS:
		return 0o644 & m.mode
	case modeLinkFS:
		return 0o644 & m.mode
	}
	return 0o644
}

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

// openRegular opens a file with open, given flag with O_NONBLOCK added so
// that a FIFO does not block, and returns it with its FileInfo. A file
// that is not a regular one (a FIFO, a device such as /dev/zero, a
// directory) is closed again and refused with a *notRegular: reading or
// hashing it would block or never end. Other errors are open's and
// stat's, which name the file.
func openRegular[F interface {
	Stat() (fs.FileInfo, error)
	Close() error
}](flag int, open func(flag int) (F, error)) (F, fs.FileInfo, error) {
	var none F
	f, err := open(flag | oNonblock)
	if err != nil {
		return none, nil, err
	}
	fi, err := statRegular(f)
	if err != nil {
		f.Close()
		return none, nil, err
	}
	return f, fi, nil
}

// statRegular returns f's FileInfo, or a *notRegular when f is not a
// regular file.
func statRegular(f interface{ Stat() (fs.FileInfo, error) }) (fs.FileInfo, error) {
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &notRegular{fi.Mode()}
	}
	return fi, err
}

// notRegular says that a file to hash is not a regular file. It wraps
// ErrInvalid.
type notRegular struct{ mode fs.FileMode }

func (e *notRegular) Error() string { return kindOf(e.mode) + ", not a regular file" }
func (e *notRegular) Unwrap() error { return ErrInvalid }
