package runstate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"
)

// The attempts this session runs, as the Run keeps them beside the state:
// their contexts, which a lost session cancels, and the attempts whose end
// record could not be written.
//
// A lost session (its store's lease gone: LeaseWatcher, or an append that
// failed with ErrSessionLost) turns the Run read-only and cancels the
// context of every attempt this session runs, with the store's error as
// the cause (it wraps ErrSessionLost): another session may prove this one
// gone and begin the stage again, so the work must stop; its end record
// could not be written anyway. Any other error that turns the Run
// read-only (a failed fsync or COMMIT, an outcome unknown) cancels them
// too, with a cause wrapping ErrReadOnly and that error: no end record of
// theirs can be written any more, and the next session begins them again.
//
// An attempt whose end record (Complete, Fail, Await) could not be written,
// and whose failure left the Run writable, is over for the Run: the store
// recorded nothing (a lock wait that ran out, an append the store refused
// and undid, an output that was missing), Do returned the error, and a
// Stage's caller was told that nothing was acknowledged. The ledger still
// says it runs in this session, which is alive, so before this every later
// Begin of the stage in the Run failed with ErrBusy for good. Now the next
// Begin (or Do, or Skip) of the stage in this session records the attempt
// as interrupted, with the error that kept its end from being written, and
// goes on as for an attempt of a dead session: begins attempt n+1. Why
// interrupted: nothing of the attempt was acknowledged, so no record is
// lost; a complete cannot be written later without checking its evidence
// again (which attempt n+1 does); a fail would count against MaxAttempts,
// and could make the stage await a person, for an error that was the
// store's. Effects are keyed, not bound to an attempt: one confirmed
// during attempt n returns its stored receipt in attempt n+1, so no
// confirmed effect runs twice. Failures that leave the outcome unknown (a
// failed fsync, a lost COMMIT reply that could not be resolved) or the
// session lost make the Run read-only instead, as they always did: open
// the run again.
//
// attempts.mu is a leaf of the lock order (commit.go): it is taken with
// stMu held (a batch's decisions) or with no lock, never with c.mu held,
// and no other lock is taken under it.
type attempts struct {
	mu      sync.Mutex
	stopped error                 // the Run turned read-only: the cause its stages got (stop)
	running map[*Stage]*stageCtxs // begun in this session and not ended
	unended map[string]*Stage     // by stage name: the attempt whose end record could not be written
	ended   map[*Stage]error      // why each of unended's could not end
	intents map[string]int64      // by effect key: the seq of this session's intent whose outcome could not be written
}

// stageCtxs cancel an attempt's contexts: Stage.Context's, and the one Do
// gives the stage function.
type stageCtxs struct {
	own, fn context.CancelCauseFunc
}

// add registers st's own context (Stage.Context); when the Run is
// already read-only it is cancelled now.
func (a *attempts) add(st *Stage, own context.CancelCauseFunc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped != nil {
		own(a.stopped)
		return
	}
	if a.running == nil {
		a.running = map[*Stage]*stageCtxs{}
	}
	a.running[st] = &stageCtxs{own: own}
}

// addFn registers the context Do gives st's stage function: cancelled
// when the Run turns read-only (Do cancels it when fn returns).
func (a *attempts) addFn(st *Stage, fn context.CancelCauseFunc) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped != nil {
		fn(a.stopped)
		return
	}
	if c := a.running[st]; c != nil {
		c.fn = fn
	}
}

// done forgets st, whose attempt ended (its end record landed, or another
// record ended it), and cancels its own context with cause (nil:
// context.Canceled); Do's context for the stage function ends with fn.
func (a *attempts) done(st *Stage, cause error) {
	a.mu.Lock()
	c := a.running[st]
	delete(a.running, st)
	if a.unended[st.name] == st {
		delete(a.unended, st.name)
		delete(a.ended, st)
	}
	a.mu.Unlock()
	if c != nil {
		c.own(cause)
	}
}

// stop cancels every running attempt's contexts, once: the Run turned
// read-only for err (setSticky). The cause is err when it wraps
// ErrSessionLost, else ErrReadOnly and err.
func (a *attempts) stop(err error) {
	if !errors.Is(err, ErrSessionLost) && !errors.Is(err, ErrReadOnly) {
		err = fmt.Errorf("%w: %w", ErrReadOnly, err)
	}
	a.mu.Lock()
	if a.stopped != nil {
		a.mu.Unlock()
		return
	}
	a.stopped = err
	running := a.running
	a.running = nil
	a.mu.Unlock()
	for _, c := range running {
		c.own(err)
		if c.fn != nil {
			c.fn(err)
		}
	}
}

// endFailed notes that st's end record could not be written (err): the
// next Begin of the stage in this session interrupts the attempt.
func (a *attempts) endFailed(st *Stage, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.unended == nil {
		a.unended, a.ended = map[string]*Stage{}, map[*Stage]error{}
	}
	if old := a.unended[st.name]; old != nil {
		delete(a.ended, old)
	}
	a.unended[st.name], a.ended[st] = st, err
}

// orphan returns the attempt of the stage cur whose end record this
// session could not write, with the reason an interrupted record gives
// it; nil when cur is not such an attempt (another session's, or one
// still running here). The caller holds stMu, in a batch.
func (r *Run) orphan(cur *StageStatus) (*Stage, string) {
	if cur == nil || cur.State != StateRunning || cur.Session != r.session {
		return nil, ""
	}
	a := &r.att
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.unended[cur.Name]
	if st == nil || st.attempt != cur.Attempt {
		return nil, ""
	}
	msg := oneLine(a.ended[st].Error())
	if len(msg) > 1000 {
		n := 1000
		for n > 0 && !utf8.RuneStart(msg[n]) {
			n--
		}
		msg = msg[:n] + "..."
	}
	return st, fmt.Sprintf("its end record could not be written in session %s (%s)", r.session, msg)
}

// An effect's intent whose outcome record (confirm, unconfirmed) could not
// be written is the same case for Effect: the intent is this live
// session's, so every later Effect of the key in the Run was ErrBusy
// ("being attempted by this session") for good. Now the next Effect of the
// key takes the intent as one of a dead session's: Check decides (found:
// confirmed with its receipt; not found: sent again), and without a Check
// it is recorded unconfirmed for a person to resolve, so an effect that
// may have landed is never sent again unasked.

// intentFailed notes that the outcome of key's intent, which this session
// recorded, could not be written.
func (r *Run) intentFailed(key string) {
	r.stMu.RLock()
	cur := r.st.effects[key]
	var seq int64
	if cur != nil && cur.State == EffectIntent && cur.Session == r.session {
		seq = cur.Seq
	}
	r.stMu.RUnlock()
	if seq == 0 {
		return
	}
	a := &r.att
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.intents == nil {
		a.intents = map[string]int64{}
	}
	a.intents[key] = seq
}

// orphanIntent reports whether cur is an intent of this session whose
// outcome could not be written (intentFailed). The caller holds stMu, in
// a batch.
func (r *Run) orphanIntent(key string, cur *EffectStatus) bool {
	if cur.State != EffectIntent || cur.Session != r.session {
		return false
	}
	a := &r.att
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.intents[key] == cur.Seq
}

// interrupted ends the Stage handle of an attempt that a record of this
// session interrupted (orphan): a later Complete of it returns ErrStale.
func (a *attempts) interrupted(st *Stage) {
	a.done(st, fmt.Errorf("%w: %s attempt %d was interrupted: its end record could not be written, and the stage was begun again", ErrStale, st.name, st.attempt))
}

// sessionLost is the store's word that the session's lease is gone
// (LeaseWatcher): the Run turns read-only, and setSticky cancels the
// running attempts.
func (r *Run) sessionLost(err error) {
	if err == nil || !errors.Is(err, ErrSessionLost) {
		err = fmt.Errorf("%w: %s: %v; this Run is read-only: open the run again", ErrSessionLost, r.store, err)
	}
	r.setSticky(err)
}

// watchLease starts the goroutine that waits for the store's word that
// the session is lost, until Close.
func (r *Run) watchLease() {
	w, ok := r.store.(LeaseWatcher)
	if !ok {
		return
	}
	lost := w.LeaseLost()
	if lost == nil {
		return
	}
	r.unwatch = make(chan struct{})
	stop := r.unwatch
	go func() {
		select {
		case err := <-lost:
			r.sessionLost(err)
		case <-stop:
		}
	}()
}

// stopWatching ends watchLease's goroutine (Close, crash).
func (r *Run) stopWatching() {
	r.unwatchOnce.Do(func() {
		if r.unwatch != nil {
			close(r.unwatch)
		}
	})
}
