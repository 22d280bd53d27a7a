package runstate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// logs/ledger.wal is where an acknowledged record may be made durable
// before the ledger itself is. An fdatasync after an append must also
// write the file's new size: on ext4 with a journal that is a journal
// commit (447 µs against 227 µs for an overwrite, loop-mounted here), on
// ext4 without one an inode-table write (120 against 84 µs). An overwrite
// of bytes already allocated writes no metadata (`cd bench && go run
// ./cmd/compare -probe`). So a checkpoint appends its records to
// logs/ledger.jsonl as before, with one write(2) that every reader sees at
// once, then may write the same bytes over a fixed-size, preallocated file
// and fdatasync that instead of the ledger. Whether it does is measured
// (see pick): without a journal the overwrite's gain is lost to the
// renames a checkpoint makes, with one it halves a checkpoint.
//
// The journal is a 4 KiB header page and a ring. The ring mirrors the
// ledger: ledger byte x is at ring byte x mod (size-4096). The header
// page holds two 512-byte slots, "runstate-wal 1 end=E seq=S hash=H\n":
// the ledger offset a durable batch ended at, the seq and the chain hash
// of its last record. A batch writes its bytes into the ring and its end
// into the slot that does not hold the newest end, then one fdatasync; a
// power loss in the middle may tear that slot or those bytes (sector by
// sector), never the other slot, which still names a batch that is whole.
//
// Each writer keeps, under the ledger lock, two offsets: covered (every
// ledger byte before it is durable, in the ledger or in the journal) and
// synced (every byte before it is durable in the ledger itself, by its
// own fdatasync of the ledger). A batch that ends at end is written to
// the ring, from covered on, only when end-ring ≤ synced: the ring bytes
// it overwrites belong to ledger bytes already durable. Otherwise the
// ledger is fdatasync'd, as without a journal: once per ~252 KiB of
// records. A writer that knows less than another process did syncs more
// often, never less. Writing from covered, not from the batch's start,
// puts the begins written meanwhile without an fsync (and other
// processes' appends) in the ring too, so the ring has no gap.
//
// After a machine crash the ledger may end before records that were
// acknowledged, or hold, in the part not yet fdatasync'd, sectors that
// were lost, zeroed or garbled with later sectors kept: a hole with
// records after it. Open (under the ledger lock), Repair and every reader
// look at the slots before they judge the ledger (replayJournal): where
// the ledger's chain stops (its end, a torn tail, a damaged line) before
// the end a slot names, and the ring, read from there, continues the hash
// chain up to exactly that end, seq and hash, those records are the ones
// the ledger lost, and the ledger is read on after them. Open and Repair
// write them back over the ledger's bytes there and fdatasync it; Inspect,
// Verify and ReadLedger read them in memory. A snapshot is trusted only
// when the ledger's lines in the ring's window chain up to it
// (journalAgrees). The ledger is never cut back below bytes a slot names,
// except by Repair's TruncateAt with Force, which copies the journal's
// records back first and clears the journal before it cuts.
//
// After a clean Close, or after a process is killed (the kernel still has
// its writes), logs/ledger.jsonl alone holds every acknowledged record.
const walFile = "logs/ledger.wal"

// walSize is the size of a new journal; a journal of another size (a
// multiple of walAlign, at least walMin) is used as it is. walHeader is
// the header page; a slot is one sector.
const (
	walSize   = 256 << 10
	walAlign  = 4096
	walMin    = 64 << 10
	walHeader = 4096
	walSlot   = 512
)

// journal is a Run's handle on logs/ledger.wal. Its fields are used under
// the ledger lock by the group-commit leader only.
type journal struct {
	f       file  // nil: no journal (NoSync): the ledger is fsync'd
	ring    int64 // the ring's size: the journal's size less the header
	covered int64 // ledger bytes before this are durable (ledger or journal)
	synced  int64 // ledger bytes before this are durable in the ledger
	slots   [2 * walSlot]byte
	// Which way makes a batch durable faster on this file system (see
	// pick): cost holds a moving average of each way's time, 0 until
	// measured, taking the smaller of each two times in a row; prev
	// holds each way's last time.
	cost    [2]time.Duration
	prev    [2]time.Duration
	best    int // wayLedger or wayRing
	last    int // the way the previous batch took
	batches int
	explore int // batches left in a trial of the other way
	// pending is what this process wrote to the ledger from pendingAt
	// on, contiguously, kept until it is durable: the begins a batch
	// must put in the ring with its own records, without reading them
	// back. Guarded by stMu (side writers append to it).
	pending   []byte
	pendingAt int64
}

// The two ways to make a batch durable.
const (
	wayLedger = 0 // fdatasync the ledger
	wayRing   = 1 // write the ring and a header slot, fdatasync the journal
)

// durableWay is Options.durable: which way a test wants.
type durableWay int

const (
	durableMeasured   durableWay = iota // pick by measurement
	durableLedgerOnly                   // always fdatasync the ledger
	durableRingOnly                     // the ring whenever it can take the batch
)

// exploreEvery and exploreFor: every exploreEvery batches, the way not
// chosen is tried for exploreFor batches (the first of which is not
// measured: after the ring, the ledger's first fdatasync also writes what
// the ring held), so that both averages follow the file system.
const (
	exploreEvery = 64
	exploreFor   = 4
)

// pick chooses the way for a batch that the ring could take. Which is
// faster depends on the file system, and not by a little: on ext4 with a
// journal the ring's overwrite + fdatasync is about half an append +
// fdatasync (a journal commit for the new size); on ext4 without one a
// Do through the ring was 1.07x a Do through the ledger's fdatasync here
// (PERF.md). So it is measured, not assumed.
func (j *journal) pick() int {
	j.batches++
	if j.explore > 0 {
		j.explore--
		return 1 - j.best
	}
	if j.cost[1-j.best] == 0 || j.batches%exploreEvery == 0 {
		j.explore = exploreFor - 1
		return 1 - j.best
	}
	return j.best
}

// note records that a batch took way and d; it reports whether the best
// way changed. The ring must be 10% faster to be chosen: the ledger's own
// fdatasync keeps it whole without a restore. The average takes the
// smaller of each two times in a row of a way: one time the kernel made
// long by running another process meanwhile (milliseconds, against tens
// of microseconds) would otherwise count as the way's and, the other way
// being tried in only exploreFor batches of exploreEvery, hold the choice
// for hundreds of batches; a way that became slower is slow twice.
func (j *journal) note(way int, d time.Duration) bool {
	if way != j.last {
		j.last = way // the first batch after a switch is not typical
		return false
	}
	m := d
	if j.prev[way] != 0 {
		m = min(d, j.prev[way])
	}
	j.prev[way] = d
	if j.cost[way] == 0 {
		j.cost[way] = m
	} else {
		j.cost[way] += (m - j.cost[way]) / 8
	}
	if j.cost[wayLedger] == 0 || j.cost[wayRing] == 0 {
		return false
	}
	best := wayLedger
	if j.cost[wayRing] < j.cost[wayLedger]*9/10 {
		best = wayRing
	}
	changed := best != j.best
	j.best = best
	return changed
}

// wrote notes b, written to the ledger at offset at. The caller holds
// stMu.
func (j *journal) wrote(b []byte, at int64) {
	if j.f == nil {
		return
	}
	if j.pendingAt+int64(len(j.pending)) != at || int64(len(j.pending)+len(b)) > j.ring {
		j.pending, j.pendingAt = j.pending[:0], at
	}
	j.pending = append(j.pending, b...)
}

// span returns the ledger bytes from covered to end when pending holds
// them all, else nil. The slice stays valid while side writers append.
// The caller holds stMu.
func (j *journal) span(end int64) []byte {
	if j.pendingAt > j.covered || j.pendingAt+int64(len(j.pending)) < end {
		return nil
	}
	return j.pending[j.covered-j.pendingAt : end-j.pendingAt]
}

// trim drops what is durable from pending. The caller holds stMu and is
// the leader, with no side writer running.
func (j *journal) trim() {
	k := j.covered - j.pendingAt
	switch {
	case k <= 0:
	case k >= int64(len(j.pending)):
		j.pending, j.pendingAt = j.pending[:0], j.covered
	default:
		j.pending = append(j.pending[:0], j.pending[k:]...)
		j.pendingAt = j.covered
	}
}

// walMark is one header slot: a batch that ended at end, with the seq
// and chain hash of its last record.
type walMark struct {
	end  int64
	seq  int64
	hash string
}

func (m walMark) encode(dst []byte) {
	clear(dst)
	copy(dst, fmt.Sprintf("runstate-wal 1 end=%d seq=%d hash=%s\n", m.end, m.seq, m.hash))
}

// parseMark reads a slot; ok is false for zeros, a torn slot or anything
// else.
func parseMark(slot []byte) (m walMark, ok bool) {
	rest, found := bytes.CutPrefix(slot, []byte("runstate-wal 1 end="))
	if !found {
		return m, false
	}
	num := func(after string) (int64, bool) {
		var v int64
		i := 0
		for ; i < len(rest) && i < 19 && rest[i] >= '0' && rest[i] <= '9'; i++ {
			v = v*10 + int64(rest[i]-'0')
		}
		if i == 0 || v <= 0 {
			return 0, false
		}
		rest, found = bytes.CutPrefix(rest[i:], []byte(after))
		return v, found
	}
	if m.end, ok = num(" seq="); !ok {
		return m, false
	}
	if m.seq, ok = num(" hash="); !ok {
		return m, false
	}
	if len(rest) < 65 || rest[64] != '\n' {
		return m, false
	}
	for _, c := range rest[:64] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return m, false
		}
	}
	m.hash = string(rest[:64])
	return m, true
}

// openJournal opens logs/ledger.wal, creating it when it is missing: a
// file of walSize zeros, fsync'd, renamed into place and its name made
// durable, so that overwriting it never changes its size. The caller
// holds the ledger lock.
func (s *dirStore) openJournal() error {
	p := s.path(walFile)
	f, size, err := openWAL(s.fs, s.abs, os.O_RDWR)
	if isNotExist(err) {
		if err := writeAtomic(s.fs, s.path(tmpDir), s.sessionOrNone(), p, make([]byte, walSize), !s.opts.NoSync); err != nil {
			return fmt.Errorf("runstate: create %s: %w", p, err)
		}
		f, size, err = openWAL(s.fs, s.abs, os.O_RDWR)
	}
	if err != nil {
		return err
	}
	s.wal = journal{f: f, ring: size - walHeader, best: wayRing, last: wayLedger}
	return nil
}

// openWAL opens the journal of the run in dir, only where it is
// (openOwn), and checks its size. A missing journal is an error for which
// isNotExist holds.
func openWAL(fsys fileSystem, dir string, flag int) (file, int64, error) {
	p := filepath.Join(dir, filepath.FromSlash(walFile))
	f, fi, err := openOwn(fsys, dir, walFile, flag)
	if errors.As(err, new(*ownFileError)) {
		return nil, 0, err // names it
	}
	if nr := (*notRegular)(nil); errors.As(err, &nr) {
		return nil, 0, fmt.Errorf("runstate: %s is %w: it was not written by runstate; move it away to open the run", p, err)
	}
	if err != nil {
		if isNotExist(err) {
			return nil, 0, err
		}
		if pe := (*os.PathError)(nil); errors.As(err, &pe) && pe.Path == p {
			err = pe.Err // named once, below
		}
		return nil, 0, fmt.Errorf("runstate: open %s: %w (it may hold acknowledged records that a machine crash kept out of the ledger: make it readable)", p, err)
	}
	if fi.Size() < walMin || fi.Size()%walAlign != 0 {
		f.Close()
		return nil, 0, fmt.Errorf("runstate: %s is %d bytes, not a multiple of %d of at least %d: it was not written by runstate; move it away to open the run (records a machine crash left only in it would be lost)",
			p, fi.Size(), walAlign, walMin)
	}
	return f, fi.Size(), nil
}

// makeDurable makes the ledger durable up to pos, where the batch b (the
// bytes just written) ends: by writing the ledger bytes from covered to
// there (span, when pending has them) into the ring, and pos into a
// header slot, and fdatasyncing the journal; or, when the ring cannot
// take them, by fdatasyncing the ledger. The caller holds the ledger lock
// and is the leader; side writers may append meanwhile, after pos.
func (s *dirStore) makeDurable(b, span []byte, pos chain) error {
	j := &s.wal
	end := pos.offset
	start := end - int64(len(b))
	way := wayLedger
	if j.f != nil && j.covered <= start && end-j.covered <= j.ring && end-j.ring <= j.synced {
		switch s.opts.durable {
		case durableMeasured:
			way = j.pick()
		case durableRingOnly:
			way = wayRing
		}
	}
	t := time.Now()
	if err := s.syncBatch(way, b, span, pos); err != nil {
		return err
	}
	if j.f != nil && j.note(way, time.Since(t)) {
		s.log.Debug("runstate: a batch is made durable the other way now", "ring", j.best == wayRing,
			"ledger_fdatasync", j.cost[wayLedger], "ring_fdatasync", j.cost[wayRing])
	}
	return nil
}

// syncBatch makes the batch durable the way makeDurable chose.
func (s *dirStore) syncBatch(way int, b, span []byte, pos chain) error {
	j := &s.wal
	end := pos.offset
	start := end - int64(len(b))
	if way == wayLedger {
		if err := s.ledger.Sync(); err != nil {
			return &WriteError{Path: s.path(ledgerFile), Op: "sync", Sticky: true, Err: err}
		}
		j.synced, j.covered = end, end
		return nil
	}
	if err := s.checkJournal(); err != nil {
		return err
	}
	data := b
	if span != nil {
		data = span
	} else if j.covered < start {
		// Records written since covered without an fsync (begins, or
		// other processes' appends): the ring must hold them too, or a
		// restore would stop at the gap.
		data = make([]byte, end-j.covered)
		if _, err := s.ledger.ReadAt(data[:start-j.covered], j.covered); err != nil {
			return &WriteError{Path: s.path(ledgerFile), Op: "read", Sticky: true, Err: err}
		}
		copy(data[start-j.covered:], b)
	}
	// The slot to write: not the one with the newest end (another
	// process may have written since this one last did).
	wp := s.path(walFile)
	if _, err := j.f.ReadAt(j.slots[:], 0); err != nil {
		return &WriteError{Path: wp, Op: "read", Sticky: true, Err: err}
	}
	m0, _ := parseMark(j.slots[:walSlot])
	m1, _ := parseMark(j.slots[walSlot:])
	slot := int64(0)
	if m1.end < m0.end {
		slot = 1
	}
	off := j.covered % j.ring
	n := min(int64(len(data)), j.ring-off)
	_, err := j.f.WriteAt(data[:n], walHeader+off)
	if err == nil && n < int64(len(data)) {
		_, err = j.f.WriteAt(data[n:], walHeader)
	}
	if err == nil {
		mark := j.slots[slot*walSlot : (slot+1)*walSlot]
		walMark{end: end, seq: pos.seq, hash: pos.hash}.encode(mark)
		_, err = j.f.WriteAt(mark, slot*walSlot)
	}
	if err != nil {
		return &WriteError{Path: wp, Op: "write", Sticky: true, Err: err}
	}
	if err := j.f.Sync(); err != nil {
		return &WriteError{Path: wp, Op: "sync", Sticky: true, Err: err}
	}
	j.covered = end
	return nil
}
