package runstate

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"

	"github.com/google/uuid"
)

// Opening a run, in order: the store recovers what a crash left and takes
// the session's liveness (for the file store: guard its own files, take
// logs/ledger.lock with a bounded wait, open the ledger and note which
// file it is, load the snapshot and replay the tail with the journal
// standing in for what a machine crash lost, copy the journal's records
// back, refuse to create a run over a lost one, cut a torn tail, lock the
// session's file); then the Run loads the state, checks the run's identity
// and, under the run's lock, writes its first batch: the create record
// (a new run, durably), the records that say which sessions are gone (with
// the store's proof: Batch.Alive) and the session's open record.

// open runs the sequence above. On an error the caller closes the store.
func (r *Run) open(ctx context.Context) error {
	ctx, cancel := r.lockContext(ctx)
	defer cancel()
	sid, err := uuid.NewV7()
	if err != nil {
		return err
	}
	r.session = sid.String()
	r.host, _ = os.Hostname()
	if a, ok := r.store.(attacher); ok {
		a.attach(r.sessionInfo, r.openSessions)
	}
	snap, at, err := r.store.Open(ctx, r.session)
	if err != nil {
		return err
	}
	st, err := r.loadOpened(ctx, snap, at)
	if err != nil {
		return err
	}
	r.st = st
	if c, ok := r.store.(WorkDirChecker); ok {
		if err := c.CheckWorkDir(r.dir, st.identity.ID); err != nil {
			return err // before the session's first record: nothing recorded
		}
	}
	if err := r.openOutputs(); err != nil {
		return err
	}
	if st.pos.seq == 0 && r.opts.Request == "" {
		return fmt.Errorf("%w: Options.Request is required to create a run in %s", ErrInvalid, r.runName())
	}
	if err := r.checkRequest(st); err != nil {
		return err
	}
	t := &tx{sync: st.pos.seq == 0, fn: r.openRecords, done: make(chan struct{})}
	b, err := r.store.Lock(ctx, st.position())
	if err != nil {
		return err
	}
	if err := r.runLocked([]*tx{t}, b, nil); err != nil && t.err == nil {
		return err
	}
	return t.err
}

// attacher is a store that looks sessions up in the Run's state (the file
// store's liveness needs the open record's host and pid).
type attacher interface {
	attach(info func(string) *SessionStatus, open func() []*SessionStatus)
}

// sessionInfo is the state's record of a session; the caller holds stMu.
func (r *Run) sessionInfo(id string) *SessionStatus { return r.st.sessions[id] }

// openSessions copies the state's open sessions, when no batch holds the
// state (nil otherwise): for a message naming the lock's holder.
func (r *Run) openSessions() []*SessionStatus {
	if !r.stMu.TryRLock() {
		return nil
	}
	defer r.stMu.RUnlock()
	if r.st == nil {
		return nil
	}
	var list []*SessionStatus
	for _, ss := range r.st.sessions {
		c := *ss
		list = append(list, &c)
	}
	return list
}

// loadOpened makes the state from what the store's Open returned: its
// snapshot, then the records after it. The file store hands over the state
// it read to recover (openedState), which spares reading the ledger twice.
func (r *Run) loadOpened(ctx context.Context, snap []byte, at Position) (*state, error) {
	if o, ok := r.store.(interface{ openedState() *state }); ok {
		if st := o.openedState(); st != nil {
			return st, nil
		}
	}
	st := newState()
	if snap != nil {
		s, pos, err := decodeManifest(snap)
		if err == nil && pos.End == at.End && pos.Hash == at.Hash && s.pos.seq == at.Seq {
			st = s
			st.pos.crc = at.CRC
		} else {
			r.log.Warn("runstate: the store's snapshot does not match its position; replaying every record", "store", r.store.String())
			at = Position{}
		}
	} else {
		at = Position{}
	}
	p := replayer{path: r.store.String(), c: &st.pos, apply: st.replay}
	if _, err := r.store.Read(ctx, at, p.line); err != nil {
		return nil, corruptIn(r.store, err)
	}
	return st, nil
}

// openOutputs opens the local directory, creating it (and logs/tmp, where
// outputs are written before they are renamed into place) when a store
// that is not the file store left it missing. A working directory whose
// logs, logs/tmp or another of runstate's own names is a symbolic link
// (or a FIFO, a device) is refused first, naming it, as Open refuses a
// run directory's (guardOwnFiles): creating logs/tmp would follow the
// link out of the directory.
func (r *Run) openOutputs() error {
	perm := fs.FileMode(0o644)
	if p, ok := r.store.(interface{ outputPerm() fs.FileMode }); ok {
		perm = p.outputPerm()
	} else {
		if r.dir == "" {
			return fmt.Errorf("%w: OpenStore needs a local directory", ErrInvalid)
		}
		if _, err := guardOwnFiles(r.dir, nil); err != nil {
			return err
		}
		p := filepath.Join(r.dir, filepath.FromSlash(tmpDir))
		if err := os.MkdirAll(p, 0o755); err != nil {
			return mkdirError(p, err)
		}
	}
	out, err := openOutputs(r.dir, r.session, perm)
	if err != nil {
		return err
	}
	r.out = out
	return nil
}

// checkRequest refuses a run created for another Request.
func (r *Run) checkRequest(s *state) error {
	if s.pos.seq > 0 && r.opts.Request != "" && r.opts.Request != s.identity.Request {
		other := "another directory"
		if _, file := r.store.(*dirStore); !file {
			other = "another run" // the working directory is not the run
		}
		return fmt.Errorf("%w: %s serves request %q, not %q: use %s for other work",
			ErrMismatch, r.runName(), s.identity.Request, r.opts.Request, other)
	}
	return nil
}

// runName names the run for errors: the run directory, or where a store
// that is not the file store keeps it (Store.String), since the working
// directory of such a run is not the run.
func (r *Run) runName() string {
	if _, file := r.store.(*dirStore); file {
		return r.dir
	}
	return r.store.String()
}

// openRecords decides the first batch, on the state as the run's lock
// found it: the create record for a new run (exactly one of racing
// creators finds the run empty), an interrupted record for each running
// stage whose session is gone, a record for each gone session that held
// no stage, an unconfirmed record for each intent whose session died
// before a confirmation, and the open record.
func (r *Run) openRecords(s *state) ([]*Record, error) {
	var recs []*Record
	if s.pos.seq == 0 {
		if r.opts.Request == "" {
			return nil, fmt.Errorf("%w: Options.Request is required to create a run in %s", ErrInvalid, r.runName())
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		data, _ := json.Marshal(runIdentity{ID: id.String(), Request: r.opts.Request, Revision: r.opts.Revision,
			Environment: r.opts.Environment, Format: FormatVersion})
		recs = append(recs, &Record{Ev: evCreate, Data: data})
	} else if err := r.checkRequest(s); err != nil {
		return nil, err
	}
	gone := map[string]bool{}
	for _, name := range s.stageNames() {
		st := s.stages[name]
		if st.State == StateRunning && !r.alive(st.Session) {
			recs = append(recs, &Record{Ev: evInterrupted, Stage: name, Attempt: st.Attempt,
				Reason: "session " + st.Session + " is gone"})
			gone[st.Session] = true
		}
	}
	// A session that died between stages left no begin to interrupt; say
	// it is gone, so it leaves the list of open sessions.
	for _, id := range slices.Sorted(maps.Keys(s.sessions)) {
		if !gone[id] && !r.alive(id) {
			data, _ := json.Marshal(sessionGone{Session: id})
			recs = append(recs, &Record{Ev: evInterrupted, Reason: "session " + id + " is gone", Data: data})
		}
	}
	// An intent whose session died without a confirmation is in doubt:
	// say so now, so that Status, the metrics and next-steps.txt show it
	// before the next Effect call asks Check. It is not unconfirmed (a
	// person's business) until Check is missing or fails.
	for _, key := range slices.Sorted(maps.Keys(s.effects)) {
		e := s.effects[key]
		if e.State == EffectIntent && !r.alive(e.Session) {
			recs = append(recs, &Record{Ev: evUnconfirmed, Key: key, Reason: inDoubtReason,
				Error: "session " + e.Session + " died between the intent and a confirmation"})
		}
	}
	data, _ := json.Marshal(openData{PID: os.Getpid(), Host: r.host, Revision: r.opts.Revision, Environment: r.opts.Environment})
	recs = append(recs, &Record{Ev: evOpen, Data: data})
	return recs, nil
}

// alive reports whether session may still be running: not when the state
// holds its close record (or a record that it is gone), which proves it
// without asking the store; else by the proof of the batch under way
// (Batch.Alive). The caller holds stMu, in a batch.
func (r *Run) alive(session string) bool {
	if session == "" {
		return false
	}
	if session != r.session && r.st.sessions[session] == nil {
		return false // closed, or recorded as gone
	}
	return r.cur.Alive(session)
}

// operator names the person behind an operator action.
func operator() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "unknown"
}
