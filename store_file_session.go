package runstate

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/gofrs/flock"
)

// A session's liveness in the file store is its lock file,
// logs/sessions/<session>.lock, locked for the session's life: the kernel
// drops a dead process's locks, also after a kill -9.

// openHere holds the ids of the sessions this process has open.
var openHere sync.Map

// holdSession creates and locks logs/sessions/<session>.lock. The caller
// holds the ledger lock, so no other session can see the file unlocked.
func (s *dirStore) holdSession() error {
	s.sesLock = flock.New(s.path(sessionsDir + "/" + s.session + ".lock"))
	ok, err := s.sesLock.TryLock()
	if err != nil {
		return fmt.Errorf("runstate: lock %s: %w", s.sesLock.Path(), err)
	}
	if !ok {
		return fmt.Errorf("runstate: lock %s: held by another process (a session id used twice?); open the run again", s.sesLock.Path())
	}
	openHere.Store(s.session, true)
	return nil
}

// cleanStale removes the lock files of sessions that are gone and the temp
// files they left. The caller holds the ledger lock.
func (s *dirStore) cleanStale() {
	live := map[string]bool{s.session: true}
	ents, _ := s.fs.ReadDir(s.path(sessionsDir))
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".lock")
		if !ok || id == s.session {
			continue
		}
		if s.alive(id) {
			live[id] = true
			continue
		}
		if err := s.fs.Remove(s.path(sessionsDir + "/" + e.Name())); err == nil {
			s.log.Debug("runstate: removed stale session lock", "session", id)
		}
	}
	ents, _ = s.fs.ReadDir(s.path(tmpDir))
	for _, e := range ents {
		id, _, _ := strings.Cut(e.Name(), "~")
		if len(e.Name()) > 36 {
			id = e.Name()[:36]
		}
		if !live[id] {
			if err := s.fs.Remove(s.path(tmpDir + "/" + e.Name())); err == nil {
				s.log.Info("runstate: removed a temp file left by a killed write", "file", s.path(tmpDir+"/"+e.Name()))
			}
		}
	}
	// The handoff files of killed sessions (see handoffFiles.publish).
	ents, _ = s.fs.ReadDir(s.path(handoffDir))
	for _, e := range ents {
		if id := e.Name(); len(id) < 36 || !live[id[:36]] {
			_ = s.fs.Remove(s.path(handoffDir + "/" + e.Name()))
		}
	}
}

// liveSessions lists the sessions whose lock file in logs/sessions is
// held: processes that have the run open (Repair, which has no session).
// The caller holds the ledger lock.
func (s *dirStore) liveSessions() []string {
	ents, _ := os.ReadDir(s.path(sessionsDir))
	var live []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), ".lock"); ok && s.aliveBy(id, nil) {
			live = append(live, id)
		}
	}
	return live
}

// alive reports whether a session may still be running, and so may hold
// a stage or an effect's Do: a running stage of a session that is not
// alive is begun again, its intent checked. "Not alive" needs proof,
// since being wrong runs a stage twice and sends an effect twice:
//
//   - its lock file, logs/sessions/<session>.lock, can be locked: the
//     process that held it for the session's life is gone (the kernel
//     drops a dead process's locks, also after a kill -9);
//   - or the file is missing and the session has closed (its close
//     record removes it from the state: Close removes the file after it);
//   - or the file is missing, the session's open record names this host
//     and its pid, and no process with that pid exists (or it is this
//     process, which has not the session open: openHere).
//
// A missing lock file of an open session on another host, or whose pid
// still exists (the session's, or a process that reused the pid), proves
// nothing: a person may have removed the file (rm logs/sessions/*.lock).
// The session counts as alive, its stages stay busy, and the log says
// why. An operator who knows it is gone recreates the empty file
// (touch logs/sessions/<session>.lock): a lock file that can be locked is
// proof. Without the Run's state to look in (Live, Repair), a missing
// file proves nothing either.
//
// The caller holds the ledger lock, under which session lock files are
// created, and the Run's state lock.
func (s *dirStore) alive(session string) bool { return s.aliveBy(session, s.info) }

// aliveBy is alive with the state looked up through info (nil: no state
// to look in, as for Live and Repair, which may run beside the Run's
// batches).
func (s *dirStore) aliveBy(session string, info func(string) *SessionStatus) bool {
	if session == "" {
		return false
	}
	if session == s.session {
		return true
	}
	p := s.path(sessionsDir + "/" + session + ".lock")
	// No O_CREATE: a missing file stays missing. Not through a symbolic
	// link (its target may be a device that acts on open), nor waiting
	// on a FIFO: such a file proves nothing, the session counts as alive.
	l := flock.New(p, flock.SetFlag(os.O_RDWR|oNoFollow|oNonblock))
	ok, err := l.TryLock()
	if err == nil {
		if ok {
			l.Unlock()
			return false
		}
		return true
	}
	if !isNotExist(err) {
		return true // cannot tell: assume alive, the safe side
	}
	if info == nil {
		return true // no state to look in (Live, liveSessions): cannot tell
	}
	ss := info(session)
	if ss == nil {
		return false // closed (or already recorded as gone)
	}
	if ss.Host != "" && ss.Host == s.host && ss.PID > 0 {
		if ss.PID == os.Getpid() {
			_, open := openHere.Load(session)
			return open // this process knows its own sessions
		}
		if processGone(ss.PID) {
			return false
		}
	}
	if !s.warnedMissing[session] {
		if s.warnedMissing == nil {
			s.warnedMissing = map[string]bool{}
		}
		s.warnedMissing[session] = true
		s.log.Warn("runstate: a session's lock file is missing, but nothing proves the session gone: its stages stay busy; if it is gone, recreate the file (an empty file that can be locked proves it)",
			"session", session, "file", p, "pid", ss.PID, "host", ss.Host)
	}
	return true
}
