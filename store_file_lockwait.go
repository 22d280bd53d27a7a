package runstate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/flock"
)

// lockWarnAfter: a wait for logs/ledger.lock that lasts longer than this
// is logged, with the holder (2s; tests shorten it).
var lockWarnAfter atomic.Int64

func init() { lockWarnAfter.Store(int64(2 * time.Second)) }

// waitLock takes the ledger lock, waiting as long as ctx allows (a ctx
// that is never done: as long as it takes). A wait longer than
// lockWarnAfter is logged with the holder; a wait that ctx ends fails with
// an error that names it. Open waits before it has a session or a state
// (opening): the holder is named by pid alone then.
func (s *dirStore) waitLock(ctx context.Context, opening bool) error {
	if ok, err := s.lock.TryLock(); ok || err != nil {
		if err != nil {
			return fmt.Errorf("runstate: lock %s: %w", s.path(lockFile), err)
		}
		return nil
	}
	start := time.Now()
	after := time.Duration(lockWarnAfter.Load())
	warn := time.AfterFunc(after, func() {
		s.log.Warn("runstate: still waiting for the ledger lock", "lock", s.path(lockFile),
			"waited", time.Since(start).Round(time.Millisecond), "holder", s.describeHolder(!opening))
	})
	err := lockContext(ctx, s.lock)
	warn.Stop()
	if err != nil {
		if ctx.Err() != nil {
			return s.lockWaitError(ctxErr(ctx), time.Since(start), !opening)
		}
		return fmt.Errorf("runstate: lock %s: %w", s.path(lockFile), err)
	}
	if d := time.Since(start); d >= after {
		s.log.Info("runstate: got the ledger lock", "lock", s.path(lockFile), "waited", d.Round(time.Millisecond))
	}
	return nil
}

// locker is the ledger lock as lockContext uses it.
type locker interface {
	Lock() error
	Unlock() error
}

// lockContext waits for l until ctx is done. flock(2) and LockFileEx
// cannot be interrupted, so a goroutine waits; when ctx ends first, that
// goroutine drops the lock as soon as it gets it.
func lockContext(ctx context.Context, l locker) error {
	if ctx.Done() == nil {
		return l.Lock()
	}
	var (
		mu        sync.Mutex
		abandoned bool
		got       = make(chan error, 1)
	)
	go func() {
		err := l.Lock()
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			if err == nil {
				_ = l.Unlock()
			}
			return
		}
		got <- err
	}()
	select {
	case err := <-got:
		return err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case err := <-got:
		return err // it came as ctx ended: take it
	default:
	}
	abandoned = true
	return ctx.Err()
}

// ctxErr is ctx's error, which says why a wait ended; a deadline is
// ErrLockTimeout too.
func ctxErr(ctx context.Context) error {
	err := ctx.Err()
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (%w)", ErrLockTimeout, err)
	}
	return err
}

// lockWaitError is the error of a call that gave up waiting for the
// ledger lock after waited, for cause: it names the lock's holder.
func (s *dirStore) lockWaitError(cause error, waited time.Duration, withState bool) error {
	return fmt.Errorf("runstate: gave up waiting for %s after %s: %w; it is held by %s: a stopped or hung process? resume it (kill -CONT PID) or end it, then call again; nothing was recorded",
		s.path(lockFile), waited.Round(time.Millisecond), cause, s.describeHolder(withState))
}

// describeHolder says who holds the ledger lock, as well as it can be found.
// On Linux /proc/locks names the pid holding the lock file's inode; the
// open records of the run's sessions map a pid to a session and a host.
// Elsewhere (or where /proc is not mounted) it lists the run's open
// sessions: one of them, or an operator's command, holds it. It reads the
// state (withState: Open has made it, and the session's id and host) only
// when no batch is using it.
func (s *dirStore) describeHolder(withState bool) string {
	pids := lockHolders(s.path(lockFile))
	var sessions []*SessionStatus
	if withState && s.openSessions != nil {
		sessions = s.openSessions()
	}
	slices.SortFunc(sessions, func(a, b *SessionStatus) int { return strings.Compare(a.ID, b.ID) })
	describe := func(ss *SessionStatus) string {
		return fmt.Sprintf("session %s (pid %d on host %s, opened %s)", ss.ID, ss.PID, ss.Host, ss.At.Format(time.RFC3339))
	}
	if len(pids) > 0 {
		var who []string
		for _, pid := range pids {
			w := fmt.Sprintf("pid %d", pid)
			if pid == os.Getpid() {
				w += " (this process)"
			}
			for _, ss := range sessions {
				if ss.PID == pid && ss.Host == s.host && ss.ID != s.session {
					w += ", " + describe(ss)
				}
			}
			who = append(who, w)
		}
		return strings.Join(who, "; ") + " on this host"
	}
	if !withState {
		return "a process not found (one of the run's sessions, or an operator's command)"
	}
	var open []string
	for _, ss := range sessions {
		if ss.ID != s.session {
			open = append(open, describe(ss))
		}
	}
	if len(open) == 0 {
		return "a process not found among the run's open sessions (an operator's command?)"
	}
	return "a process not found; the run's other open sessions: " + strings.Join(open, "; ")
}

// lockFor takes lock (logs/ledger.lock at path, for a tool that has no Run:
// Repair), waiting at most timeout (zero: as long as it takes).
func lockFor(lock *flock.Flock, path string, timeout time.Duration) error {
	if timeout <= 0 {
		if err := lock.Lock(); err != nil {
			return fmt.Errorf("runstate: lock %s: %w", path, err)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ok, err := lock.TryLockContext(ctx, 10*time.Millisecond)
	if ok {
		return nil
	}
	if ctx.Err() == nil {
		return fmt.Errorf("runstate: lock %s: %w", path, err)
	}
	who := "a process that could not be found (one of the run's sessions, or an operator's command)"
	if pids := lockHolders(path); len(pids) > 0 {
		who = fmt.Sprintf("pid %v on this host", strings.Trim(fmt.Sprint(pids), "[]"))
	}
	return fmt.Errorf("runstate: gave up waiting for %s after %s: %w; it is held by %s: a stopped or hung process? resume it (kill -CONT PID) or end it, then try again; nothing was changed",
		path, timeout, ctxErr(ctx), who)
}
