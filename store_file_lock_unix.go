//go:build unix

package runstate

import (
	"os"
	"sync"
	"syscall"
)

// syncDir fsyncs a directory so that a rename or create in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// rename is rename(2). os.Rename also stats newpath first, to refuse
// replacing a directory on every system alike; runstate never renames
// over a directory it did not make, and rename(2) refuses a file over a
// directory on its own.
func rename(oldpath, newpath string) error {
	for {
		err := syscall.Rename(oldpath, newpath)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
		}
		return nil
	}
}

// ledgerLock is the writers' lock on logs/ledger.lock. It keeps the file
// open for the session's life, so that an append batch takes it with one
// flock(2) call and drops it with another (gofrs/flock opens and closes
// the file each time). Lock also excludes the Run's own goroutines, which
// flock does not: two locks through one open file are one lock.
type ledgerLock struct {
	mu   sync.Mutex
	f    *os.File
	conn syscall.RawConn
	// how and err are flock's argument and result, ctl the function it
	// passes to conn.Control: made once (openLedgerLock), so that a
	// batch's two flock calls allocate nothing (a closure and its err
	// escaped in each: 4 allocations a batch). Guarded by mu.
	how int
	err error
	ctl func(fd uintptr)
}

func openLedgerLock(path string) (*ledgerLock, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o600) // as gofrs/flock opens it
	if err != nil {
		return nil, err
	}
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	l := &ledgerLock{f: f, conn: conn}
	l.ctl = func(fd uintptr) {
		for {
			l.err = syscall.Flock(int(fd), l.how)
			if l.err != syscall.EINTR {
				return
			}
		}
	}
	return l, nil
}

// Lock waits for the lock.
func (l *ledgerLock) Lock() error {
	l.mu.Lock()
	if err := l.flock(syscall.LOCK_EX); err != nil {
		l.mu.Unlock()
		return err
	}
	return nil
}

// Unlock drops the lock taken by Lock.
func (l *ledgerLock) Unlock() error {
	err := l.flock(syscall.LOCK_UN)
	l.mu.Unlock()
	return err
}

// flock is flock(2) on the lock file. The caller holds mu.
func (l *ledgerLock) flock(how int) error {
	l.how, l.err = how, nil
	if cerr := l.conn.Control(l.ctl); cerr != nil {
		return cerr // closed: released as a killed process's would be
	}
	return l.err
}

// Close closes the lock file, which drops the lock if it is held. It does
// not wait for a holder in this process (crash calls it mid-batch).
func (l *ledgerLock) Close() error { return l.f.Close() }

// processGone reports whether no process with pid exists on this machine:
// kill(pid, 0) fails with ESRCH. A process that exists (even one that
// reused the pid, or that this user may not signal) is not gone.
func processGone(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}

// TryLock takes the lock if no other process (nor this Run) holds it,
// without waiting.
func (l *ledgerLock) TryLock() (bool, error) {
	if !l.mu.TryLock() {
		return false, nil
	}
	err := l.flock(syscall.LOCK_EX | syscall.LOCK_NB)
	if err == nil {
		return true, nil
	}
	l.mu.Unlock()
	if err == syscall.EWOULDBLOCK {
		return false, nil
	}
	return false, err
}
