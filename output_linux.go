package runstate

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/runstate/runstate/internal/unnamed"
)

// outputDirs holds, on Linux, the two directories that Stage.WriteFile
// works in, open for the session: the run directory and logs/tmp. With
// them a new output is an unnamed file made in its directory (O_TMPFILE),
// written, then linked in under its name: four system calls (open, write,
// linkat, close) and one directory change, where a temp file in logs/tmp
// renamed into place is three (create in logs/tmp, and a rename between
// directories, which the kernel serializes for the whole file system).
// Among goroutines writing outputs at once this halves the CPU an output
// costs (PERF.md). An output that already exists (a stage run again:
// the link fails with EEXIST) is replaced through a temp file in logs/tmp, as a link cannot
// replace it: the two are exchanged (renameat2 RENAME_EXCHANGE) and the
// temp name, which then holds the old file, removed. A rename over the
// old file would do the same in one call, but on ext4 it starts the
// writeback of the new file's data (auto_da_alloc), which made replacing
// an output cost four times a new one here; where exchange is not
// supported, it is renameat. Either way add one open and close per directory level of
// its path, where going through os.Root costs about twenty system calls
// (os.Root walks every component of both paths again on each call, and
// checks the new file for the poller). Anything unusual (a missing
// directory, a symbolic link on the way, any error) falls back to the
// os.Root path, which handles it and words the error.
type outputDirs struct {
	root *os.File // the run directory
	tmp  *os.File // logs/tmp
	// link is how a new output is linked in, learnt at the first one.
	link unnamed.Way
	// noExchange: this kernel or file system cannot exchange two names;
	// an output is replaced by renameat.
	noExchange atomic.Bool
}

// open opens the directories through root, so that they are the ones
// os.Root would use. On failure the fast path is simply not used.
func (d *outputDirs) open(root *os.Root) {
	rf, err := root.Open(".")
	if err != nil {
		return
	}
	tf, err := root.Open(tmpDir)
	if err != nil {
		rf.Close()
		return
	}
	d.root, d.tmp = rf, tf
}

func (d *outputDirs) close() {
	if d.root != nil {
		d.root.Close()
		d.tmp.Close()
	}
}

// errFallBack says the fast path declined.
var errFallBack = errors.New("runstate: output fast path declined")

// write writes data to rel (a clean, slash-separated path inside the run
// directory that ownPath passed) with mode perm (less the umask), through
// a temp file named tmpName in logs/tmp when rel exists, and reports
// whether it did. When it did not, it left nothing behind and the caller
// uses os.Root. The directories are used through Control, so a concurrent
// Close cannot hand their descriptors to another file mid-call.
func (d *outputDirs) write(rel, tmpName string, data []byte, perm fs.FileMode) bool {
	if d.root == nil {
		return false
	}
	err := errFallBack
	_ = control(d.root, func(rootFd int) {
		_ = control(d.tmp, func(tmpFd int) {
			err = d.writeAt(rootFd, tmpFd, rel, tmpName, data, uint32(perm))
		})
	})
	return err == nil
}

func control(f *os.File, fn func(fd int)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(func(fd uintptr) { fn(int(fd)) })
}

func (d *outputDirs) writeAt(rootFd, tmpFd int, rel, tmpName string, data []byte, perm uint32) error {
	// The output's directory: each component opened with O_NOFOLLOW, so
	// that no symbolic link is followed (os.Root follows those that stay
	// inside; the fallback does, after checkLanding). So the directory is
	// the one rel names, which is not runstate's.
	dirFd, base := rootFd, rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		base = rel[i+1:]
		for c := range strings.SplitSeq(rel[:i], "/") {
			fd, err := openDir(dirFd, c)
			if dirFd != rootFd {
				syscall.Close(dirFd)
			}
			if err != nil {
				return errFallBack
			}
			dirFd = fd
		}
		defer syscall.Close(dirFd)
	}
	// A new output: an unnamed file, linked in once written (a reader
	// sees all of it or nothing, a killed process leaves nothing). An
	// existing one (a stage run again), or no O_TMPFILE here: through
	// logs/tmp.
	lerr := d.link.Write(dirFd, base, data, perm)
	if lerr == nil {
		return nil
	}
	replace := errors.Is(lerr, syscall.EEXIST)
	fd, err := openat(tmpFd, tmpName, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, perm)
	if err != nil {
		return errFallBack
	}
	err = writeAll(fd, data)
	if cerr := syscall.Close(fd); err == nil {
		err = cerr
	}
	if err == nil && replace && !d.noExchange.Load() {
		switch xerr := unnamed.Exchange(tmpFd, tmpName, dirFd, base); {
		case xerr == nil:
			// tmpName holds the old file now. A directory there (base
			// was one: renameat would have refused it) is swapped back.
			if syscall.Unlinkat(tmpFd, tmpName) == nil {
				return nil
			}
			_ = unnamed.Exchange(tmpFd, tmpName, dirFd, base)
			err = errFallBack
		case errors.Is(xerr, unnamed.ErrUnsupported):
			d.noExchange.Store(true)
		}
		// Otherwise (the old file is gone meanwhile): renameat.
	}
	if err == nil {
		err = ignoringEINTR(func() error { return syscall.Renameat(tmpFd, tmpName, dirFd, base) })
	}
	if err != nil {
		_ = syscall.Unlinkat(tmpFd, tmpName)
		return errFallBack
	}
	return nil
}

func openDir(dirFd int, name string) (int, error) {
	return openat(dirFd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
}

func openat(dirFd int, name string, flags int, perm uint32) (fd int, err error) {
	err = ignoringEINTR(func() error {
		fd, err = syscall.Openat(dirFd, name, flags, perm)
		return err
	})
	return fd, err
}

func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := syscall.Write(fd, data)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func ignoringEINTR(fn func() error) error {
	for {
		if err := fn(); err != syscall.EINTR {
			return err
		}
	}
}
