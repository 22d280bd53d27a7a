//go:build windows

package runstate

import (
	"errors"
	"os"
	"sync"
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
	mu sync.Mutex
	fl *flock.Flock
}

func openLedgerLock(path string) (*ledgerLock, error) {
	return &ledgerLock{fl: flock.New(path)}, nil
}

// Lock waits for the lock.
func (l *ledgerLock) Lock() error {
	l.mu.Lock()
	if err := l.fl.Lock(); err != nil {
		l.mu.Unlock()
		return err
	}
	return nil
}

// Unlock drops the lock taken by Lock.
func (l *ledgerLock) Unlock() error {
	err := l.fl.Unlock()
	l.mu.Unlock()
	return err
}

// Close drops the lock if it is held. It does not wait for a holder in
// this process (crash calls it mid-batch).
func (l *ledgerLock) Close() error { return l.fl.Close() }
