package runstate

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"
)

// The file store's Batch: logs/ledger.lock held for one append batch. The
// ledger's appends are visible to every reader at once (one write(2)), so
// it is a SideWriter: begins are written while another batch waits for its
// fdatasync.

// begin starts the batch once the lock is taken.
func (s *dirStore) begin(from Position) *dirBatch {
	b := &s.batch
	b.from, b.lines, b.span = chainAt(from), nil, nil
	b.first = !s.cleaned
	return b
}

// Tail passes what other processes appended since from, and cuts a torn
// tail.
func (b *dirBatch) Tail(fn func(line []byte) error) error {
	s := b.s
	size, err := fileSize(s.ledger)
	if err != nil {
		return fmt.Errorf("runstate: size of %s: %w", s.path(ledgerFile), err)
	}
	b.at = b.from
	c := &b.at
	if size > c.offset {
		sr := io.NewSectionReader(s.ledger, c.offset, size-c.offset)
		if _, err := replay(sr, s.path(ledgerFile), c, func(_ *Record, line []byte) error { return fn(line) }); err != nil {
			return err
		}
	}
	if size == c.offset {
		return nil // no torn tail: spare cutTorn's seek
	}
	return s.cutTorn(*c)
}

// Now is the local clock.
func (b *dirBatch) Now() time.Time { return time.Now().UTC() }

// Alive is the session lock files' proof (store_file_session.go).
func (b *dirBatch) Alive(session string) bool { return b.s.alive(session) }

// Append writes lines with one write. A write that fails is cut back; one
// that cannot be cut back is a sticky WriteError.
func (b *dirBatch) Append(recs []*Record, lines []byte, to Position) error {
	if err := b.write(lines, to); err != nil {
		return err
	}
	b.lines, b.end = lines, chainAt(to)
	b.span = b.s.wal.span(to.End)
	return nil
}

// AppendWhileSyncing is Append for a side writer (the Run holds its state
// lock): the leader's Sync is under way.
func (b *dirBatch) AppendWhileSyncing(recs []*Record, lines []byte, to Position) error {
	return b.write(lines, to)
}

func (b *dirBatch) write(lines []byte, to Position) error {
	s := b.s
	start := to.End - int64(len(lines))
	if n, err := s.ledger.Write(lines); err != nil {
		werr := &WriteError{Path: s.path(ledgerFile), Op: "write", Err: err}
		if n > 0 {
			if terr := s.ledger.Truncate(start); terr != nil {
				werr.Sticky = true
			}
		}
		return werr
	}
	s.wal.wrote(lines, start)
	return nil
}

// Sync makes the ledger durable up to the leader's last Append, through
// the journal or the ledger's own fdatasync (store_file_wal.go). Before it, the
// ledger's name must still lead to the file appended to (store_file_check.go).
// For a new run it also makes the names of the ledger, of logs/ and of
// the run directory durable, or a power loss could drop the whole run
// although its create record was fsync'd.
func (b *dirBatch) Sync(ctx context.Context) error {
	s := b.s
	if b.lines == nil {
		return nil
	}
	if err := s.checkBatch(); err != nil { // beside the fsync, where there is one
		return err
	}
	if s.opts.NoSync {
		return nil
	}
	if err := s.makeDurable(b.lines, b.span, b.end); err != nil {
		return err
	}
	if b.from.seq == 0 && !s.opts.NoSync {
		for _, d := range []string{s.path("logs"), s.abs, filepath.Dir(s.abs)} {
			if err := s.fs.SyncDir(d); err != nil {
				return &WriteError{Path: d, Op: "sync", Err: err}
			}
		}
	}
	return nil
}

// Publish writes the projections: the handoff through hard links
// (store_file_handoff.go), manifest.json through a temp file and a rename,
// without fsync (a manifest that does not match the ledger is ignored and
// rebuilt).
func (b *dirBatch) Publish(at Position, manifest, handoff []byte) {
	s := b.s
	if handoff != nil {
		if err := s.handoff.publish(s, handoff); err != nil {
			s.log.Warn("runstate: cannot write the handoff; the next Open rebuilds it", "file", s.path(nextStepsFile), "err", err)
		}
	}
	if manifest != nil {
		p := s.path(manifestFile)
		if err := writeAtomic(s.fs, s.path(tmpDir), s.session, p, manifest, false); err != nil {
			s.log.Warn("runstate: cannot write the manifest; the next Open rebuilds it", "file", p, "err", err)
		}
	}
}

// Unlock drops what the journal no longer needs and the ledger lock. The
// session's first batch first takes a new run's session lock (its create
// record is written now) and removes the files of sessions it recorded as
// gone: their lock files were the proof (alive) until then.
func (b *dirBatch) Unlock() error {
	s := b.s
	s.wal.trim()
	var err error
	if b.first {
		if s.holdLater && s.sesLock == nil {
			err = s.holdSession()
		}
		if err == nil {
			s.cleanStale()
			s.cleaned = true
		}
	}
	if uerr := s.lock.Unlock(); err == nil && uerr != nil {
		err = fmt.Errorf("runstate: unlock %s: %w", s.path(lockFile), uerr)
	}
	return err
}

// Abort cuts what the leader's Append wrote and is not durable, and drops
// the lock.
func (b *dirBatch) Abort() error {
	s := b.s
	if b.lines != nil {
		start := b.end.offset - int64(len(b.lines))
		if err := s.ledger.Truncate(start); err != nil {
			_ = s.lock.Unlock()
			return &WriteError{Path: s.path(ledgerFile), Op: "truncate", Sticky: true, Err: err}
		}
	}
	s.wal.trim()
	return s.lock.Unlock()
}
