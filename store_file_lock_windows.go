//go:build windows

package runstate

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gofrs/flock"
)

// syncDir is a no-op on Windows: NTFS makes a rename durable with the file's
// metadata, and a directory cannot be opened for FlushFileBuffers.
func syncDir(dir string) error { return nil }

const (
	errorAccessDenied     syscall.Errno = 5
	errorSharingViolation syscall.Errno = 32
)

// rename retries os.Rename for a short while when another process (a reader,
// a virus scanner, the search indexer) holds the target open, as cmd/go's
// robustio does: MoveFileEx fails with ACCESS_DENIED or SHARING_VIOLATION
// until that handle is closed.
func rename(oldpath, newpath string) error {
	deadline := time.Now().Add(2 * time.Second)
	delay := time.Millisecond
	for {
		err := os.Rename(oldpath, newpath)
		if err == nil {
			return nil
		}
		var errno syscall.Errno
		if !errors.As(err, &errno) || (errno != errorAccessDenied && errno != errorSharingViolation) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(delay)
		if delay < 100*time.Millisecond {
			delay *= 2
		}
	}
}

// ledgerLock is the writers' lock on logs/ledger.lock, through gofrs/flock
// (LockFileEx). Lock also excludes the Run's own goroutines, which the
// file lock does not.
type ledgerLock struct {
	mu     sync.Mutex
	fl     *flock.Flock
	closed atomic.Bool // Close was called: Lock stops polling
}

func openLedgerLock(path string) (*ledgerLock, error) {
	return &ledgerLock{fl: flock.New(path)}, nil
}

// Lock waits for the lock. It polls (TryLock, then sleeps of 1 to 8 ms)
// rather than block in LockFileEx: gofrs/flock holds its mutex for a
// blocked Lock, so Close would wait for a holder that may never let go
// (a stopped process); a wait that lockContext abandoned ends at Close.
func (l *ledgerLock) Lock() error {
	l.mu.Lock()
	delay := time.Millisecond
	for {
		if l.closed.Load() {
			l.mu.Unlock()
			return os.ErrClosed
		}
		ok, err := l.fl.TryLock()
		if err != nil {
			l.mu.Unlock()
			return err
		}
		if ok {
			return nil
		}
		time.Sleep(delay)
		delay = min(2*delay, 8*time.Millisecond)
	}
}

// TryLock takes the lock if no other process (nor this Run) holds it,
// without waiting.
func (l *ledgerLock) TryLock() (bool, error) {
	if !l.mu.TryLock() {
		return false, nil
	}
	ok, err := l.fl.TryLock()
	if !ok {
		l.mu.Unlock()
	}
	return ok, err
}

// Unlock drops the lock taken by Lock.
func (l *ledgerLock) Unlock() error {
	err := l.fl.Unlock()
	l.mu.Unlock()
	return err
}

// Close drops the lock if it is held. It does not wait for a holder in
// this process (crash calls it mid-batch).
func (l *ledgerLock) Close() error {
	l.closed.Store(true)
	return l.fl.Close()
}

// processGone reports whether no process with pid exists on this machine:
// it cannot be opened (ERROR_INVALID_PARAMETER), or it has exited. A
// process that cannot be queried for another reason is not gone.
func processGone(pid int) bool {
	const (
		processQueryLimitedInformation = 0x1000
		errorInvalidParameter          = syscall.Errno(87)
		stillActive                    = 259
	)
	h, err := syscall.OpenProcess(processQueryLimitedInformation, false, uint32(pid))
	if err != nil {
		return err == errorInvalidParameter
	}
	defer syscall.CloseHandle(h)
	var code uint32
	if err := syscall.GetExitCodeProcess(h, &code); err != nil {
		return false
	}
	return code != stillActive
}
