package runstate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Reading logs/ledger.wal after a crash: the records only the journal
// holds, where the ledger lost them, and writing them back (see store_file_wal.go).

// journalTail returns the records that only the journal holds past pos
// (the end of the ledger's last good record): the ring's bytes from pos
// to the end a header slot names, when they continue the chain up to
// exactly that end, seq and hash, and that slot. Of the two slots the
// newest that holds wins. A missing journal, or one with nothing past
// pos, has none.
func journalTail(fsys fileSystem, dir string, pos chain) ([]byte, walMark, error) {
	p := filepath.Join(dir, filepath.FromSlash(walFile))
	f, size, err := openWAL(fsys, dir, os.O_RDONLY)
	if isNotExist(err) {
		return nil, walMark{}, nil
	}
	if err != nil {
		return nil, walMark{}, err
	}
	defer f.Close()
	var slots [2 * walSlot]byte
	if _, err := f.ReadAt(slots[:], 0); err != nil {
		return nil, walMark{}, fmt.Errorf("runstate: read %s: %w", p, err)
	}
	var marks []walMark
	for i := range 2 {
		if m, ok := parseMark(slots[i*walSlot : (i+1)*walSlot]); ok && m.end > pos.offset && m.seq > pos.seq {
			marks = append(marks, m)
		}
	}
	if len(marks) == 2 && marks[1].end > marks[0].end {
		marks[0], marks[1] = marks[1], marks[0]
	}
	ring := size - walHeader
	for _, m := range marks {
		n := m.end - pos.offset
		if n > ring {
			continue // cannot be: the ring holds less
		}
		data := make([]byte, n)
		at := pos.offset % ring
		k := min(n, ring-at)
		if _, err := f.ReadAt(data[:k], walHeader+at); err != nil {
			return nil, walMark{}, fmt.Errorf("runstate: read %s: %w", p, err)
		}
		if k < n {
			if _, err := f.ReadAt(data[k:], walHeader); err != nil {
				return nil, walMark{}, fmt.Errorf("runstate: read %s: %w", p, err)
			}
		}
		if continues(p, data, pos, m) {
			return data, m, nil
		}
	}
	return nil, walMark{}, nil
}

// continues reports whether data is whole lines that continue the chain
// at pos and end with the record m names.
func continues(path string, data []byte, pos chain, m walMark) bool {
	var d decoder
	var rec Record
	c := pos
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			return false
		}
		line := data[:i]
		if d.parse(line, c.hash, &rec) != nil || c.check(path, &rec) != nil {
			return false
		}
		c.seq, c.hash = rec.Seq, lineHash(line)
		data = data[i+1:]
	}
	return c.seq == m.seq && c.hash == m.hash
}

// restored is what replayJournal read from the journal in place of the
// ledger: tail, the records that stand for the ledger's bytes from at on,
// and how the ledger's own chain stopped there: at a torn tail (torn, its
// offset; else -1), at damage (damage), or at its end.
type restored struct {
	at     int64
	tail   []byte
	torn   int64
	damage *CorruptError
}

// replayJournal is replay of the ledger f, size bytes long, from c on,
// with the journal standing in where the ledger's chain stops before the
// record a header slot names: at a torn tail, at a damaged line, or at
// the ledger's end. A power loss may lose, zero or garble any sector of
// the ledger's unsynced part, and the ledger may be fdatasync'd only once
// a lap of the ring, so a hole with records after it is not corruption
// when the journal holds those bytes durably: the journal's records are
// replayed in place of the ledger's bytes up to the slot's end, then the
// ledger is read on after them (what a writer appended after that batch).
// tornAt is replay's, for the ledger's bytes after all that; j is what
// the journal stood in for. Damage that the journal does not cover is a
// *CorruptError, as from replay.
func replayJournal(fsys fileSystem, dir string, f file, size int64, c *chain, apply func(*Record, []byte) error) (tornAt int64, j restored, err error) {
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	tornAt, err = replay(io.NewSectionReader(f, c.offset, size-c.offset), lp, c, apply)
	var ce *CorruptError
	if err != nil && !errors.As(err, &ce) {
		return -1, j, err
	}
	tail, m, jerr := journalTail(fsys, dir, *c)
	switch {
	case jerr != nil && err != nil:
		return -1, j, err // the damage first: it names the line
	case jerr != nil:
		return -1, j, journalError{jerr}
	case len(tail) == 0:
		return tornAt, j, err
	}
	if ce != nil {
		if seq, at, moved := movedRecord(f, size, c.offset, m); moved {
			ce.Err = fmt.Errorf("%w; %s holds seq %d-%d whole, but seq %d, which follows them, starts at byte %d, not at byte %d where they end: records moved, so lines were deleted, repeated or inserted here by hand (a power loss damages bytes in place), and the journal's records are not written back over them",
				ce.Err, walFile, c.seq+1, m.seq, seq, at, m.end)
			return -1, j, ce
		}
	}
	j = restored{at: c.offset, tail: tail, torn: tornAt, damage: ce}
	if _, err := replay(bytes.NewReader(tail), filepath.Join(dir, filepath.FromSlash(walFile)), c, apply); err != nil {
		return -1, restored{}, err // cannot be: journalTail checked the chain
	}
	if size <= c.offset {
		return -1, j, nil
	}
	tornAt, err = replay(io.NewSectionReader(f, c.offset, size-c.offset), lp, c, apply)
	return tornAt, j, err
}

// movedRecord reports whether the ledger f, size bytes long, holds from
// at on (where its chain stops, before the journal's records that end
// with m) a whole record that a power loss cannot have put there: one
// newer than m that starts before m.end (writing the journal's records
// back would overwrite it), or m's successor (its prev is m's hash) at
// another offset than m.end. A power loss loses, zeroes or garbles bytes
// in place: every record newer than m stays at or after m.end, and m's
// successor at m.end. Records that moved mean lines deleted, repeated or
// inserted by hand, which may come after a ledger fdatasync that made
// the records after the journal's durable in the ledger alone (Close's,
// or a batch that took the ledger's way): the journal cannot stand in
// for those bytes. It looks at the lines up to the first whole record
// newer than m; it returns that record's seq and offset.
func movedRecord(f file, size, at int64, m walMark) (seq, off int64, moved bool) {
	if size <= at {
		return 0, 0, false
	}
	src := newLineSource(io.NewSectionReader(f, at, size-at))
	defer src.stop()
	var d decoder
	var rec Record
	for off = at; ; {
		line, _, err := src.next()
		if err != nil {
			return 0, 0, false // the end, a torn tail, a line too long, a failed read
		}
		start := off
		off += int64(len(line))
		if d.parse(line[:len(line)-1], m.hash, &rec) != nil || rec.Seq <= m.seq {
			continue // damaged, or a record the journal holds
		}
		next := rec.Seq == m.seq+1 && rec.Prev == m.hash
		return rec.Seq, start, start < m.end || next && start != m.end
	}
}

// seqs returns the first and the last seq of the records j holds.
func (j restored) seqs() (from, to int64) {
	var d decoder
	var rec Record
	line, _, _ := bytes.Cut(j.tail, []byte("\n"))
	if d.parse(line, "", &rec) != nil {
		return 0, 0 // cannot be: journalTail checked them
	}
	return rec.Seq, rec.Seq + int64(bytes.Count(j.tail, []byte("\n"))) - 1
}

// journalError is an error reading logs/ledger.wal, from replayJournal:
// the ledger itself read well.
type journalError struct{ error }

func (e journalError) Unwrap() error { return e.error }

// restoreJournal writes into the ledger f the records that only the
// journal holds (j, from replayJournal) over the ledger's bytes there,
// which are missing, torn or damaged, after saving those bytes aside
// (logs/ledger.jsonl.torn-<time>), and fdatasyncs it. The journal's bytes
// go where the ledger lost them (ring byte x mod size is ledger byte x),
// so what the ledger holds after them stays. It returns the file the
// replaced bytes were saved to. The caller holds the ledger lock.
func restoreJournal(fsys fileSystem, dir, session string, f file, j restored) (saved string, err error) {
	if len(j.tail) == 0 {
		return "", nil
	}
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	size, err := fileSize(f)
	if err != nil {
		return "", fmt.Errorf("runstate: size of %s: %w", lp, err)
	}
	if size > j.at {
		if saved, err = saveTorn(fsys, dir, session, f, j.at, min(size, j.at+int64(len(j.tail))), true); err != nil {
			return "", err
		}
	}
	// f is open with O_APPEND, which cannot write at an offset. A write
	// that fails half way leaves the journal's bytes or the old ones:
	// the journal still has the records.
	w, err := fsys.OpenFile(lp, os.O_WRONLY, 0)
	if err != nil {
		return "", openError(lp, err)
	}
	defer w.Close()
	if _, err := w.WriteAt(j.tail, j.at); err != nil {
		return "", &WriteError{Path: lp, Op: "write", Err: err}
	}
	if err := w.Sync(); err != nil {
		return "", &WriteError{Path: lp, Op: "sync", Err: err}
	}
	return saved, nil
}

// acknowledged returns the newest seq that a header slot of the journal
// in dir names: every record up to it was made durable and may have
// been reported to a caller. 0 without a journal or a valid slot.
func acknowledged(fsys fileSystem, dir string) int64 {
	f, _, err := openWAL(fsys, dir, os.O_RDONLY)
	if err != nil {
		return 0
	}
	defer f.Close()
	var slots [2 * walSlot]byte
	if _, err := f.ReadAt(slots[:], 0); err != nil {
		return 0
	}
	var seq int64
	for i := range 2 {
		if m, ok := parseMark(slots[i*walSlot : (i+1)*walSlot]); ok {
			seq = max(seq, m.seq)
		}
	}
	return seq
}

// clearJournal overwrites the journal with zeros and fdatasyncs it, so
// that no record in it continues the ledger (Repair's TruncateAt, before
// it cuts acknowledged records). The ledger must be durable first.
func clearJournal(fsys fileSystem, dir string) error {
	p := filepath.Join(dir, filepath.FromSlash(walFile))
	f, size, err := openWAL(fsys, dir, os.O_RDWR)
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(make([]byte, size), 0); err != nil {
		return &WriteError{Path: p, Op: "write", Err: err}
	}
	if err := f.Sync(); err != nil {
		return &WriteError{Path: p, Op: "sync", Err: err}
	}
	return nil
}

// journalAgrees reports whether the ledger f may be read from the snapshot
// at pos without looking at the bytes before it. A power loss may have
// damaged the ledger's bytes that were not fdatasync'd: those from the
// newest header slot's end less the ring's size on (store_file_wal.go keeps the
// bytes before that durable in the ledger itself). A snapshot after some
// of them would skip damage that the journal can still repair, and that
// the next lap of the ring would make permanent; so the lines from there
// on must chain, each line hashing to the prev that the line after it
// names, up to the first line that starts at or after the slot's end (the
// journal holds nothing after it) or to the snapshot's record. No journal,
// or a snapshot before the window, needs no check. It reads those lines
// one at a time: the window is the ring's size, plus a line.
func journalAgrees(fsys fileSystem, dir string, f file, pos snapshotPos) bool {
	w, size, err := openWAL(fsys, dir, os.O_RDONLY)
	if err != nil {
		return true // no journal (or one Open reports on): nothing to check against
	}
	var slots [2 * walSlot]byte
	_, err = w.ReadAt(slots[:], 0)
	w.Close()
	if err != nil {
		return true
	}
	var end int64
	for i := range 2 {
		if m, ok := parseMark(slots[i*walSlot : (i+1)*walSlot]); ok {
			end = max(end, m.end)
		}
	}
	lo := max(0, end-(size-walHeader))
	if end == 0 || lo >= pos.Offset {
		return true
	}
	// Read ahead little: the check may stop at the slot's end, far
	// before the snapshot's record (a journal that later sessions without
	// fsync did not write).
	src := &syncLines{br: bufio.NewReaderSize(io.NewSectionReader(f, lo, pos.End-lo), 32<<10)}
	partial := lo > 0 && !precededByNewline(f, lo) // a line that starts before the window
	var hash string
	for off := lo; off < pos.End; {
		line, facts, err := src.next()
		if err != nil {
			return false
		}
		start := off
		off += int64(len(line))
		if partial {
			partial = false
			continue
		}
		if hash != "" {
			prev, ok := lastPrev(line[:len(line)-1])
			if !ok || string(prev) != hash {
				return false
			}
			if start >= end {
				return true // the chain holds up to a line the journal does not hold
			}
		}
		hash = facts.hash
	}
	return hash == pos.Hash
}

// lastPrev returns the prev hash of a line that runstate wrote: its last
// field, `"prev":"<64 hex>"}`, or the one before the crc field,
// `"prev":"<64 hex>","crc":"<8 hex>"}`.
func lastPrev(line []byte) ([]byte, bool) {
	const key = `"prev":"`
	n := len(line) - 1 // the closing '}'
	if hasCRC(line) {
		n = len(line) - crcSuffix // the crc field's ','
	}
	if n < len(key)+65 || line[len(line)-1] != '}' || line[n-1] != '"' || string(line[n-65-len(key):n-65]) != key {
		return nil, false
	}
	return line[n-65 : n-1], true
}
