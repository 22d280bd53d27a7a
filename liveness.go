package runstate

import (
	"os"
	"sync"

	"github.com/gofrs/flock"
)

// openHere holds the ids of the sessions this process has open.
var openHere sync.Map

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
// proof.
//
// The caller holds the ledger lock, under which session lock files are
// created, and stMu.
func (r *Run) alive(session string) bool {
	if session == "" {
		return false
	}
	if session == r.session {
		return true
	}
	p := r.path(sessionsDir + "/" + session + ".lock")
	l := flock.New(p, flock.SetFlag(os.O_RDWR)) // no O_CREATE: a missing file stays missing
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
	if r.st == nil {
		return true // no state to look in (liveSessions): cannot tell
	}
	ss := r.st.sessions[session]
	if ss == nil {
		return false // closed (or already recorded as gone)
	}
	if ss.Host != "" && ss.Host == r.host && ss.PID > 0 {
		if ss.PID == os.Getpid() {
			_, open := openHere.Load(session)
			return open // this process knows its own sessions
		}
		if processGone(ss.PID) {
			return false
		}
	}
	if !r.warnedMissing[session] {
		if r.warnedMissing == nil {
			r.warnedMissing = map[string]bool{}
		}
		r.warnedMissing[session] = true
		r.log.Warn("runstate: a session's lock file is missing, but nothing proves the session gone: its stages stay busy; if it is gone, recreate the file (an empty file that can be locked proves it)",
			"session", session, "file", p, "pid", ss.PID, "host", ss.Host)
	}
	return true
}
