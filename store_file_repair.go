package runstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gofrs/flock"
)

// RepairOptions configure Repair. A nil *RepairOptions and the zero
// RepairOptions mean: cut a torn tail, rebuild the projections, and drop no
// acknowledged record. Repair only reads them.
type RepairOptions struct {
	// TruncateAt, when positive, cuts the ledger at the start of that line
	// (1-based; line N holds seq N): the line and every line after it are
	// dropped, after a copy of the whole ledger is saved to
	// logs/ledger.jsonl.bak-<time>. It is meant for damage in the middle of
	// the ledger, which Repair otherwise refuses to touch. It is refused
	// when the ledger has no damage at or after that line (unless Force),
	// when the damage is before that line (cutting there would keep it),
	// at line 1 (no run would be left), while a session is open on the
	// run (it would write after records that no longer exist), and when it
	// would drop records that logs/ledger.wal or manifest.json shows were
	// acknowledged (unless Force). Records that a power loss damaged in
	// the ledger and the journal holds whole are copied back first, as
	// Open would, so a cut never drops them.
	TruncateAt int

	// Force lets TruncateAt cut a ledger that has no damage at or after the
	// line, or drop records that the journal or manifest.json shows were
	// acknowledged: acknowledged records are dropped (the backup keeps
	// them). It never lets a cut keep damage.
	Force bool

	// AcceptLoss lets Repair rebuild the projections from a ledger that
	// ends before records manifest.json shows were acknowledged (records
	// lost from its end, with no torn line to show for it: a ledger
	// restored from an old backup, copied badly, or cut by a file system
	// that lost its end), which it otherwise refuses with an error
	// wrapping ErrCorrupt. The lost records are dropped for good (their
	// stages will be done again): manifest.json and logs/next-steps.txt
	// are first copied, fsync'd, to manifest.json.lost-<time> and
	// logs/next-steps.txt.lost-<time>, their only trace. It is refused
	// while a session is open on the run. Restoring the ledger from a
	// backup that holds the records is the better fix where there is one.
	AcceptLoss bool

	// LockTimeout bounds the wait for logs/ledger.lock, which a running
	// session holds for each append: a wait that runs out fails with
	// ErrLockTimeout, naming the holder where it can be found, and
	// changes nothing. Zero waits forever.
	LockTimeout time.Duration
}

// RepairReport says what Repair did; everything it names was durable when
// Repair returned. Paths are the run directory joined with the file's name
// in the run. It is a plain value, safe to keep and share.
type RepairReport struct {
	Dir    string `json:"dir"`    // the run directory, as passed to Repair
	Ledger string `json:"ledger"` // the ledger's path
	// Damage describes what was wrong with the ledger before the repair
	// ("" when nothing was).
	Damage string `json:"damage,omitempty"`
	// Restored counts the acknowledged records that a machine crash had
	// left only in logs/ledger.wal, which Repair copied into the ledger.
	Restored int64 `json:"restored,omitempty"`
	// TornBytes is the size of a torn last line that was cut, and
	// TornSaved the file it was moved to.
	TornBytes int64  `json:"torn_bytes,omitempty"`
	TornSaved string `json:"torn_saved,omitempty"`
	// Backup is the copy of the whole ledger made before a TruncateAt cut;
	// CutAt is the byte offset the ledger was cut at; CutLines and
	// CutBytes are what the cut dropped (damaged lines included).
	Backup   string `json:"backup,omitempty"`
	CutAt    int64  `json:"cut_at,omitempty"`
	CutLines int    `json:"cut_lines,omitempty"`
	CutBytes int64  `json:"cut_bytes,omitempty"`
	// Records and Bytes describe the ledger after the repair: its last
	// seq and its size, every line of it checked.
	Records int64 `json:"records"`
	Bytes   int64 `json:"bytes"`
	// Rebuilt lists the projections rewritten from the ledger.
	Rebuilt []string `json:"rebuilt"`
	// Lost describes the records lost from the ledger's end that
	// AcceptLoss dropped ("" when none were), and KeptAside lists the
	// copies of the projections that were their trace.
	Lost      string   `json:"lost,omitempty"`
	KeptAside []string `json:"kept_aside,omitempty"`
}

// Repair puts the run in dir back in a state every reader and writer
// accepts, under the ledger lock, and reports what it did:
//
//   - Acknowledged records that a machine crash left only in
//     logs/ledger.wal are copied into the ledger, as the next Open would.
//   - A torn last line (one without its '\n': a writer died mid-append;
//     never acknowledged) is moved aside to logs/ledger.jsonl.torn-<time>
//     and cut off, as the next writer would do.
//   - Any other damage (a bad line, the last one too when it ends in '\n';
//     a crc that does not match, a seq gap, a broken hash chain) is refused with an error wrapping
//     ErrCorrupt that names the line and byte offset, and nothing is
//     written, unless opts.TruncateAt says where to cut (see
//     RepairOptions).
//   - A ledger that ends before records manifest.json shows were
//     acknowledged (whole records lost from its end, with no torn line
//     to show for it) is refused with an error wrapping ErrCorrupt that
//     says how many, and nothing is written, unless opts.AcceptLoss (see
//     RepairOptions).
//   - manifest.json and logs/next-steps.txt are rebuilt from a full replay
//     of the ledger, every line checked.
//
// Repair appends no record: a torn tail was never acknowledged, so cutting
// it changes nothing any session was told, and a TruncateAt cut removes
// records whose chain no longer verifies, which no record appended after
// them could vouch for. The torn-<time> and bak-<time> files it leaves next
// to the ledger are the trace of what it cut, and the lost-<time> copies of
// the projections that of what AcceptLoss dropped.
//
// When Repair returns, the cut and the saved copies (torn-<time>,
// bak-<time>, lost-<time>) are durable (fsync'd), and so are the rebuilt
// projections. Repair may run while sessions are open on the run unless
// TruncateAt is set or lost records are accepted; it is safe to call from any
// goroutine or process, as the ledger lock serializes it with writers.
// It fails with ErrVersion for an unknown format version.
func Repair(dir string, opts *RepairOptions) (*RepairReport, error) {
	var o RepairOptions
	if opts != nil {
		o = *opts
	}
	if o.TruncateAt < 0 {
		return nil, fmt.Errorf("%w: TruncateAt %d is negative", ErrInvalid, o.TruncateAt)
	}
	if o.TruncateAt == 1 {
		return nil, fmt.Errorf("%w: cutting at line 1 would drop the create record and leave no run: restore the ledger from a backup, or remove the run directory", ErrInvalid)
	}
	// No link among runstate's files: a repair truncates and rewrites
	// them. What it writes gets the ledger's permission bits.
	mode, err := guardOwnFiles(dir, nil)
	if err != nil {
		return nil, err
	}
	fsys := withMode(osFS{}, mode)
	path := func(rel string) string { return filepath.Join(dir, filepath.FromSlash(rel)) }
	lp := path(ledgerFile)
	rep := &RepairReport{Dir: dir, Ledger: lp, Rebuilt: []string{}}
	if fi, err := os.Stat(lp); err != nil {
		if isNotExist(err) {
			return nil, fmt.Errorf("runstate: %s is not a run directory: %s does not exist", dir, lp)
		}
		return nil, fmt.Errorf("runstate: %w", err)
	} else if fi.IsDir() {
		return nil, fmt.Errorf("runstate: %s is a directory, not a ledger: move it away", lp)
	}
	if err := fsys.MkdirAll(path(tmpDir), 0o755); err != nil {
		return nil, mkdirError(path(tmpDir), err)
	}

	lock := flock.New(path(lockFile))
	if err := lockFor(lock, path(lockFile), o.LockTimeout); err != nil {
		return nil, err
	}
	defer lock.Unlock()

	f, err := fsys.OpenFile(lp, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return nil, openError(lp, err)
	}
	defer f.Close()

	// Find the damage, and where line TruncateAt starts.
	var (
		c      chain
		size   int64
		lineAt int64
		tornAt int64
		j      restored
		id     runIdentity
	)
	scan := func() error {
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("runstate: stat %s: %w", lp, err)
		}
		size, c, lineAt = fi.Size(), chain{}, -1
		tornAt, j, err = replayJournal(fsys, dir, f, size, &c, func(rec *Record, _ []byte) error {
			if rec.Seq == 1 && rec.Ev == evCreate {
				id = runIdentity{}
				_ = json.Unmarshal(rec.Data, &id) // the create record's data, for lostIn
			}
			if rec.Seq == int64(o.TruncateAt) {
				lineAt = c.offset // c is still at the record before this one
			}
			return nil
		})
		return err
	}
	err = scan()
	if len(j.tail) > 0 && (err == nil || o.TruncateAt > 0) {
		// Records a machine crash left only in the journal (store_file_wal.go), or
		// damaged in the ledger's unsynced part: copy them in first,
		// before any cut; the bytes they replace are saved aside.
		saved, rerr := restoreJournal(fsys, dir, "repair", f, j)
		if rerr != nil {
			return nil, rerr
		}
		from, to := j.seqs()
		if saved != "" {
			rep.TornBytes, rep.TornSaved = min(size, j.at+int64(len(j.tail)))-j.at, saved
		}
		err = scan()
		rep.Restored = to - from + 1
	}
	var ce *CorruptError
	damageLine, damageOff := 0, int64(-1)
	switch {
	case errors.As(err, &ce):
		damageLine, damageOff = ce.Line, ce.Offset
		rep.Damage = fmt.Sprintf("line %d (byte %d): %v", ce.Line, ce.Offset, ce.Err)
	case err != nil:
		return nil, err
	case tornAt >= 0:
		damageLine, damageOff = int(c.seq+1), tornAt
		rep.Damage = fmt.Sprintf("line %d (byte %d): torn last line of %d bytes", damageLine, tornAt, size-tornAt)
	}

	stamp := time.Now().UTC().Format("20060102T150405.000000000Z")
	if ce == nil && o.TruncateAt == 0 {
		// Whole records lost from the ledger's end (store_file_newrun.go):
		// a TruncateAt cut checks what it drops itself (keepsAcknowledged).
		if lost := lostIn(fsys, dir, id.ID, c); lost != nil {
			if !o.AcceptLoss {
				return nil, &CorruptError{Path: lp, Line: int(c.seq + 1), Offset: c.offset, Err: lost}
			}
			if live := newDirStore(dir, Options{}).liveSessions(); len(live) > 0 {
				return nil, fmt.Errorf("%w: session %s is open on %s: close it (or end its process) before accepting the loss of records",
					ErrBusy, strings.Join(live, ", "), dir)
			}
			for _, rel := range []string{manifestFile, nextStepsFile} {
				data, err := readFile(fsys, path(rel), maxManifest)
				if isNotExist(err) {
					continue
				} else if err != nil {
					return nil, fmt.Errorf("runstate: keep %s aside: %w", path(rel), err)
				}
				aside := path(rel) + ".lost-" + stamp
				if err := writeAtomic(fsys, path(tmpDir), "repair", aside, data, true); err != nil {
					return nil, fmt.Errorf("runstate: keep %s aside as %s: %w", path(rel), aside, err)
				}
				rep.KeptAside = append(rep.KeptAside, aside)
			}
			rep.Lost = lost.what()
		}
	}
	switch {
	case o.TruncateAt == 0 && ce != nil && errors.Is(ce.Err, errCRLF):
		return nil, fmt.Errorf("%w: %s line %d (byte %d): %v; repair does not convert it", ErrCorrupt, lp, ce.Line, ce.Offset, ce.Err)

	case o.TruncateAt == 0 && ce != nil:
		return nil, fmt.Errorf("%w: %s line %d (byte %d): %v: that is damage (a whole line, ended by its newline, or a broken chain), not a torn tail, and repair does not cut it by itself; %s",
			ErrCorrupt, lp, ce.Line, ce.Offset, ce.Err, cutAdvice(ce, fsys, dir))

	case o.TruncateAt == 0 && tornAt >= 0:
		aside, err := saveTorn(fsys, dir, "repair", f, tornAt, size, true)
		if err != nil {
			return nil, err
		}
		if err := cutLedger(f, lp, tornAt); err != nil {
			return nil, err
		}
		rep.TornBytes, rep.TornSaved = size-tornAt, aside

	case o.TruncateAt > 0:
		at := int64(-1)
		switch {
		case damageLine > 0 && o.TruncateAt > damageLine:
			return nil, fmt.Errorf("%w: the ledger %s is damaged at line %d (byte %d), before line %d: cutting at line %d would keep the damage; use -truncate-at %d",
				ErrInvalid, lp, damageLine, damageOff, o.TruncateAt, o.TruncateAt, damageLine)
		case damageLine == 0 && !o.Force:
			return nil, fmt.Errorf("%w: the ledger %s has no damage (%d records check out): refusing to drop acknowledged records at line %d without Force",
				ErrInvalid, lp, c.seq, o.TruncateAt)
		case o.TruncateAt == damageLine:
			at = damageOff
		case lineAt >= 0:
			at = lineAt
		default:
			return nil, fmt.Errorf("%w: the ledger %s has %d records: there is no line %d to cut at", ErrInvalid, lp, c.seq, o.TruncateAt)
		}
		if err := keepsAcknowledged(fsys, dir, lp, o, at); err != nil {
			return nil, err
		}
		if live := newDirStore(dir, Options{}).liveSessions(); len(live) > 0 {
			return nil, fmt.Errorf("%w: session %s is open on %s: close it (or end its process) before cutting acknowledged records",
				ErrBusy, strings.Join(live, ", "), dir)
		}
		// The records cut must not come back from the journal: make the
		// ledger durable as it is, then clear the journal, then cut.
		if err := f.Sync(); err != nil {
			return nil, &WriteError{Path: lp, Op: "sync", Err: err}
		}
		if err := clearJournal(fsys, dir); err != nil {
			return nil, err
		}
		backup := lp + ".bak-" + stamp
		if err := copyAtomic(fsys, path(tmpDir), "repair", backup, io.NewSectionReader(f, 0, size), true); err != nil {
			return nil, fmt.Errorf("runstate: back up %s to %s: %w", lp, backup, err)
		}
		lines, err := countLines(io.NewSectionReader(f, at, size-at))
		if err != nil {
			return nil, fmt.Errorf("runstate: read %s: %w", lp, err)
		}
		if err := cutLedger(f, lp, at); err != nil {
			return nil, err
		}
		rep.Backup, rep.CutAt, rep.CutLines, rep.CutBytes = backup, at, lines, size-at
	}

	// Rebuild the projections from a full replay of what is left.
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("runstate: stat %s: %w", lp, err)
	}
	st := newState()
	torn, err := replay(io.NewSectionReader(f, 0, fi.Size()), lp, &st.pos, st.replay)
	if err != nil {
		return nil, err
	}
	if torn >= 0 {
		return nil, fmt.Errorf("runstate: %s still ends in a torn line at byte %d after the repair (is another program writing to it?)", lp, torn)
	}
	rep.Records, rep.Bytes = st.pos.seq, st.pos.offset
	if st.pos.seq == 0 {
		return rep, nil // never created: there is nothing to project
	}
	data, err := st.encodeManifest(time.Now())
	if err != nil {
		return nil, err
	}
	for _, p := range []struct {
		rel  string
		data []byte
	}{{manifestFile, data}, {nextStepsFile, []byte(st.nextSteps(dirArg(dir)))}} {
		if err := writeAtomic(fsys, path(tmpDir), "repair", path(p.rel), p.data, true); err != nil {
			return nil, fmt.Errorf("runstate: rebuild %s: %w", path(p.rel), err)
		}
		rep.Rebuilt = append(rep.Rebuilt, path(p.rel))
	}
	return rep, nil
}

// cutAdvice says what to do about mid-file damage: restore a backup, or
// cut where the damage begins. A prev hash that does not match means the
// line before no longer hashes to what this line recorded: that line is
// the one most likely edited, so the cut drops it too. A cut that would
// drop records shown acknowledged (acknowledgedSeq) is named with -force,
// which Repair asks for then (keepsAcknowledged), and with what it drops.
func cutAdvice(ce *CorruptError, fsys fileSystem, dir string) string {
	at := ce.Line
	if errors.Is(ce.Err, errBrokenChain) {
		at--
	}
	if at < 2 {
		return "the create record is damaged: restore the ledger from a backup"
	}
	what := "from there on"
	if at < ce.Line {
		what = fmt.Sprintf("from line %d on (line %d may be the edited one)", at, at)
	}
	if acked, by := acknowledgedSeq(fsys, dir); acked >= int64(at) {
		return fmt.Sprintf("restore the ledger from a backup that holds seq %d-%d, or cut it %s, dropping acknowledged records seq %d-%d (%s shows they were made durable), with: runstate repair -truncate-at %d -force %s (a copy of the whole ledger is kept)",
			at, acked, what, at, acked, by, at, dirArg(dir))
	}
	return fmt.Sprintf("restore the ledger from a backup, or cut it %s with: runstate repair -truncate-at %d %s (a copy of the whole ledger is kept)", what, at, dirArg(dir))
}

// cutLedger truncates the ledger to size bytes and makes that durable.
func cutLedger(f file, lp string, size int64) error {
	if err := f.Truncate(size); err != nil {
		return &WriteError{Path: lp, Op: "truncate", Err: err}
	}
	if err := f.Sync(); err != nil {
		return &WriteError{Path: lp, Op: "sync", Err: err}
	}
	return nil
}

// countLines counts the lines in r, a last one without '\n' included.
func countLines(r io.Reader) (int, error) {
	buf := make([]byte, 64<<10)
	n, last := 0, byte('\n')
	for {
		k, err := r.Read(buf)
		for _, b := range buf[:k] {
			if b == '\n' {
				n++
			}
		}
		if k > 0 {
			last = buf[k-1]
		}
		if err == io.EOF {
			if last != '\n' {
				n++
			}
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// keepsAcknowledged refuses a TruncateAt cut at byte at that would drop
// records that logs/ledger.wal (a header slot's seq) or manifest.json (the
// seq it reflects) shows were made durable, and so may have been reported
// to a caller as done, unless Force: a person must choose to drop them.
func keepsAcknowledged(fsys fileSystem, dir, lp string, o RepairOptions, at int64) error {
	if o.Force {
		return nil
	}
	acked, by := acknowledgedSeq(fsys, dir)
	if acked < int64(o.TruncateAt) {
		return nil
	}
	return fmt.Errorf("%w: cutting %s at line %d (byte %d) would drop acknowledged records seq %d-%d (%s shows they were made durable, and they may have been reported done to a caller): restore the ledger from a backup, or cut anyway with -force (Force; a copy of the whole ledger is kept)",
		ErrInvalid, lp, o.TruncateAt, at, o.TruncateAt, acked, by)
}

// acknowledgedSeq is the last seq that logs/ledger.wal (a header slot's
// seq) or manifest.json (the seq it reflects) shows was made durable, and
// which of the two shows it; 0 when neither can be read.
func acknowledgedSeq(fsys fileSystem, dir string) (int64, string) {
	acked, by := acknowledged(fsys, dir), walFile
	if data, err := readFile(fsys, filepath.Join(dir, manifestFile), maxManifest); err == nil {
		if s, _, err := decodeManifest(data); err == nil && s.pos.seq > acked {
			acked, by = s.pos.seq, manifestFile
		}
	}
	return acked, by
}
