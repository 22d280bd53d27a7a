package runstatetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runstate/runstate"
)

// MemStore keeps one run in memory, for unit tests of programs built on
// runstate: no files but the outputs the stages write (and logs/tmp in
// the working directory, where they are written first). Each Open (or
// runstate.OpenStore on a Session) starts a session on the run, so that
// several Runs in one test behave as processes sharing a run directory:
// one writer lock, catch-up on what the others appended, ErrBusy for a
// stage another live session runs, and interrupted for one whose session
// was crashed (Crash) or closed.
//
// The store keeps the lines the sessions appended, and which of them were
// made durable (synced): Crash drops the rest, as a power loss would, and
// kills every session. Lines reads the ledger as it stands. A MemStore is
// safe for concurrent use; the zero value is not usable (NewMemStore).
type MemStore struct {
	id   int64
	lock chan struct{} // the run's writer lock: a token, held by one batch

	mu       sync.Mutex
	holder   string   // the session holding the writer lock
	lines    [][]byte // every line appended and visible, each with its '\n'
	end      int64    // the bytes of lines
	durable  int      // lines[:durable] survive a Crash
	manifest []byte   // the newest snapshot published
	snapAt   runstate.Position
	handoff  []byte
	handAt   int64 // the seq handoff reflects
	sessions map[string]*memLease
}

// memLease is the liveness of one session: live until it closes or dies.
type memLease struct {
	closed bool // closed cleanly
	dead   bool // crashed (Crash, runstatetest.Crash, a power loss)
}

var memStores atomic.Int64

// NewMemStore returns an empty memory store: the first session opened on
// it creates the run. Nothing it holds outlives the process; within it,
// what a Run synced survives Crash and the rest does not (see MemStore).
// Safe for concurrent use, by several Runs at once.
func NewMemStore() *MemStore {
	return &MemStore{
		id:       memStores.Add(1),
		lock:     make(chan struct{}, 1),
		sessions: map[string]*memLease{},
	}
}

// Open starts a session on the store's run, as runstate.Open does on a run
// directory: runstate.OpenStore(m.Session(), dir, opts). dir is the
// session's working directory, where the stages' outputs go (sessions that
// share the outputs share dir). What is durable when it returns is what
// runstate.Open says. Safe for concurrent use.
func (m *MemStore) Open(dir string, opts *runstate.Options) (*runstate.Run, error) {
	return runstate.OpenStore(m.Session(), dir, opts)
}

// Session returns a new runstate.Store on the store's run, for one session:
// pass it to runstate.OpenStore, which opens it and closes it with the Run.
// Its Read and Live also work without Open (runstate.InspectStore). Safe
// for concurrent use.
func (m *MemStore) Session() runstate.Store { return &memSession{m: m} }

// Lines returns the run's ledger lines as they stand, each without its
// '\n': every record appended and visible, synced or not. The slices are
// copies, the caller's to keep. Safe for concurrent use.
func (m *MemStore) Lines() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([][]byte, len(m.lines))
	for i, line := range m.lines {
		out[i] = bytes.Clone(line[:len(line)-1])
	}
	return out
}

// Durable returns how many of the run's lines were made durable: those
// that Crash keeps. Safe for concurrent use.
func (m *MemStore) Durable() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.durable
}

// Crash simulates a power loss: every line appended but not made durable
// is dropped, with a snapshot or handoff that reflects one of them, and
// every open session dies (its Run's next append fails with
// runstate.ErrSessionLost and the Run turns read-only; close it, and open
// new sessions to go on). A batch that holds the writer lock keeps it
// until its Run lets go; nothing it appends lands. Safe for concurrent
// use.
func (m *MemStore) Crash() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, line := range m.lines[m.durable:] {
		m.end -= int64(len(line))
	}
	m.lines = slices.Clip(m.lines[:m.durable]) // readers may hold the rest
	if m.snapAt.Seq > int64(m.durable) {
		m.manifest, m.snapAt = nil, runstate.Position{}
	}
	if m.handAt > int64(m.durable) {
		m.handoff, m.handAt = nil, 0
	}
	for _, l := range m.sessions {
		if !l.closed {
			l.dead = true
		}
	}
}

// Handoff returns the newest handoff (logs/next-steps.txt) a session
// published, or nil. Safe for concurrent use.
func (m *MemStore) Handoff() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.handoff)
}

// String names the store in errors and messages: "memory store N", N
// counting the MemStores of the process. Safe for concurrent use.
func (m *MemStore) String() string { return fmt.Sprintf("memory store %d", m.id) }

// alive is Batch.Alive's rule: a session is gone when it closed or died;
// one this store never saw may be running somewhere (unknown: alive).
// m.mu is held.
func (m *MemStore) alive(session string) bool {
	if session == "" {
		return false
	}
	l, ok := m.sessions[session]
	return !ok || !l.closed && !l.dead
}

// check reports whether at names a record the store holds: its seq
// within the lines, its hash that line's, its End where the line ends.
// m.mu is held.
func (m *MemStore) check(at runstate.Position) error {
	if at.Seq == 0 {
		if at.End != 0 || at.Hash != "" {
			return fmt.Errorf("runstate: %s: position %+v before the first record has a hash or an end", m, at)
		}
		return nil
	}
	if at.Seq > int64(len(m.lines)) {
		return fmt.Errorf("%w: %s: position seq %d is past the last record (seq %d): records it saw are gone", runstate.ErrCorrupt, m, at.Seq, len(m.lines))
	}
	line := m.lines[at.Seq-1]
	sum := sha256.Sum256(line[:len(line)-1])
	if hex.EncodeToString(sum[:]) != at.Hash {
		return fmt.Errorf("%w: %s: the record at seq %d is not the one the position names (hash %.12s…, the store has %.12s…)", runstate.ErrCorrupt, m, at.Seq, at.Hash, hex.EncodeToString(sum[:]))
	}
	return nil
}

// memSession is the Store one Run uses: a session on a MemStore.
type memSession struct {
	m      *MemStore
	id     string
	opened bool
	strays int // refused Opens whose Close is still to come; m.mu guards it
}

func (s *memSession) String() string { return s.m.String() }

func (s *memSession) Blobs() runstate.Blobs { return nil }

// Address is "": no runstate command reads a memory store
// (runstate.Addresser), so the handoff names no command on it.
func (s *memSession) Address() string { return "" }

// LookAt says where the records of a memory store are, for the handoff.
func (s *memSession) LookAt() []string {
	return []string{s.m.String() + ": the records, in this process only (MemStore.Lines, Run.Status, Run.NextSteps)"}
}

// Open registers the session, live until Close or a Crash, and returns
// the newest snapshot, if it still matches the records.
func (s *memSession) Open(_ context.Context, session string) ([]byte, runstate.Position, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.opened {
		// The failed OpenStore closes s next: that Close is ignored, so
		// that it does not end the session of the Run s serves.
		s.strays++
		return nil, runstate.Position{}, fmt.Errorf("%w: %s: a Store from MemStore.Session serves one Run: call Session again", runstate.ErrInvalid, m)
	}
	if _, ok := m.sessions[session]; ok || session == "" {
		return nil, runstate.Position{}, fmt.Errorf("%w: %s: session %q opened twice", runstate.ErrInvalid, m, session)
	}
	s.id, s.opened = session, true
	m.sessions[session] = &memLease{}
	if m.manifest == nil || m.check(m.snapAt) != nil {
		return nil, runstate.Position{}, nil
	}
	return bytes.Clone(m.manifest), m.snapAt, nil
}

// Lock takes the writer lock for one batch.
func (s *memSession) Lock(ctx context.Context, from runstate.Position) (runstate.Batch, error) {
	m := s.m
	if err := s.lost(); err != nil {
		return nil, err
	}
	select {
	case m.lock <- struct{}{}:
	case <-ctx.Done():
		m.mu.Lock()
		holder := m.holder
		m.mu.Unlock()
		err := fmt.Errorf("runstate: %s: waiting for the writer lock (held by session %s): %w", m, holder, ctx.Err())
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %w", runstate.ErrLockTimeout, err)
		}
		return nil, err
	}
	return s.locked(from)
}

// TryLock is Lock without a wait (runstate.TryLocker).
func (s *memSession) TryLock(from runstate.Position) (runstate.Batch, bool, error) {
	if err := s.lost(); err != nil {
		return nil, false, err
	}
	select {
	case s.m.lock <- struct{}{}:
	default:
		return nil, false, nil
	}
	b, err := s.locked(from)
	return b, err == nil, err
}

// locked starts a batch once the session holds the lock token; on an
// error it gives the token back.
func (s *memSession) locked(from runstate.Position) (runstate.Batch, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	unlock := func() { <-m.lock }
	if l := m.sessions[s.id]; l == nil || l.dead || l.closed {
		unlock()
		return nil, fmt.Errorf("%w: %s: session %s is gone (crashed or closed): open a new session", runstate.ErrSessionLost, m, s.id)
	}
	if err := m.check(from); err != nil {
		unlock()
		return nil, err
	}
	m.holder = s.id
	return &memBatch{s: s, from: from, end: m.end}, nil
}

// lost returns ErrSessionLost when the session died or closed.
func (s *memSession) lost() error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.sessions[s.id]; !s.opened || l == nil || l.dead || l.closed {
		return fmt.Errorf("%w: %s: session %s is gone (crashed or closed): open a new session", runstate.ErrSessionLost, m, s.id)
	}
	return nil
}

// Read passes the lines after from; a memory store tears no line.
func (s *memSession) Read(ctx context.Context, from runstate.Position, fn func(line []byte) error) (int64, error) {
	m := s.m
	m.mu.Lock()
	if err := m.check(from); err != nil {
		m.mu.Unlock()
		return 0, err
	}
	lines := m.lines[from.Seq:len(m.lines):len(m.lines)] // appends make new backing arrays past cap
	m.mu.Unlock()
	for _, line := range lines {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := fn(line[:len(line)-1]); err != nil {
			return 0, err
		}
	}
	return 0, nil
}

// Live applies Alive's rule to each session.
func (s *memSession) Live(_ context.Context, sessions []string) (map[string]bool, error) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	live := make(map[string]bool, len(sessions))
	for _, id := range sessions {
		live[id] = m.alive(id)
	}
	return live, nil
}

// Close ends the session's liveness: closed when clean, dead otherwise.
// Unsynced lines stay (a killed process leaves what it wrote to the
// kernel); only MemStore.Crash loses them.
func (s *memSession) Close(clean bool) error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.strays > 0 {
		s.strays-- // a refused Open's Close
		return nil
	}
	l := m.sessions[s.id]
	if l == nil {
		return nil
	}
	if clean && !l.dead {
		l.closed = true
	} else {
		l.dead = true
	}
	return nil
}

// memBatch is one append batch under the writer lock. Appended lines wait
// in pending until Sync or Unlock makes them visible.
type memBatch struct {
	s       *memSession
	from    runstate.Position
	end     int64    // the store's end when the lock was taken, plus pending
	pending [][]byte // appended, not yet visible
	done    bool
}

func (b *memBatch) Tail(fn func(line []byte) error) error {
	m := b.s.m
	m.mu.Lock()
	lines := m.lines[b.from.Seq:len(m.lines):len(m.lines)]
	m.mu.Unlock()
	for _, line := range lines {
		if err := fn(line[:len(line)-1]); err != nil {
			return err
		}
	}
	return nil
}

func (b *memBatch) Now() time.Time { return time.Now().UTC() }

func (b *memBatch) Alive(session string) bool {
	m := b.s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.alive(session)
}

// Append checks that lines are whole and land where to says, and keeps
// them pending.
func (b *memBatch) Append(recs []*runstate.Record, lines []byte, to runstate.Position) error {
	m := b.s.m
	if b.done {
		return fmt.Errorf("runstate: %s: Append after the batch ended", m)
	}
	if len(lines) == 0 || lines[len(lines)-1] != '\n' {
		return fmt.Errorf("%w: %s: Append of %d bytes that do not end in a line break", runstate.ErrInvalid, m, len(lines))
	}
	var split [][]byte
	for rest := lines; len(rest) > 0; {
		i := bytes.IndexByte(rest, '\n')
		split = append(split, bytes.Clone(rest[:i+1]))
		rest = rest[i+1:]
	}
	if recs != nil && len(recs) != len(split) {
		return fmt.Errorf("%w: %s: Append of %d records in %d lines", runstate.ErrInvalid, m, len(recs), len(split))
	}
	m.mu.Lock()
	seq := int64(len(m.lines) + len(b.pending) + len(split))
	m.mu.Unlock()
	if to.Seq != seq || to.End != b.end+int64(len(lines)) {
		return fmt.Errorf("%w: %s: Append of %d lines to seq %d, end %d; they end at seq %d, end %d", runstate.ErrInvalid, m, len(split), to.Seq, to.End, seq, b.end+int64(len(lines)))
	}
	b.pending = append(b.pending, split...)
	b.end = to.End
	return nil
}

// land makes the pending lines visible; durable marks them synced too.
// It returns ErrSessionLost, landing nothing, for a session that died.
func (b *memBatch) land(durable bool) error {
	m := b.s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if l := m.sessions[b.s.id]; l == nil || l.dead {
		b.pending = nil
		return fmt.Errorf("%w: %s: session %s died before its records landed: open a new session", runstate.ErrSessionLost, m, b.s.id)
	}
	for _, line := range b.pending {
		m.lines = append(m.lines, line)
		m.end += int64(len(line))
	}
	b.pending = nil
	if durable {
		m.durable = len(m.lines)
	}
	return nil
}

func (b *memBatch) Sync(context.Context) error { return b.land(true) }

func (b *memBatch) Publish(at runstate.Position, manifest, handoff []byte) {
	m := b.s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if manifest != nil && at.Seq >= m.snapAt.Seq {
		m.manifest, m.snapAt = bytes.Clone(manifest), at
	}
	if handoff != nil && at.Seq >= m.handAt {
		m.handoff, m.handAt = bytes.Clone(handoff), at.Seq
	}
}

func (b *memBatch) Unlock() error {
	if b.done {
		return nil
	}
	err := b.land(false)
	b.release()
	return err
}

func (b *memBatch) Abort() error {
	if b.done {
		return nil
	}
	b.pending = nil
	b.release()
	return nil
}

// release gives the writer lock back.
func (b *memBatch) release() {
	m := b.s.m
	b.done = true
	m.mu.Lock()
	m.holder = ""
	m.mu.Unlock()
	<-m.lock
}
