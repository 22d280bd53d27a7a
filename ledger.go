package runstate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/runstate/runstate/internal/escape"
)

// FormatVersion is the run directory format this package writes and reads.
const FormatVersion = 1

// maxLine caps the length of one ledger line, as raft-wal caps an entry:
// a longer line is corruption, not a reason to allocate without bound.
const maxLine = 16 << 20

// Ledger events (the ev field). See the package documentation.
const (
	evCreate      = "create"
	evOpen        = "open"
	evClose       = "close"
	evPlan        = "plan"
	evBegin       = "begin"
	evComplete    = "complete"
	evFail        = "fail"
	evSkip        = "skip"
	evInterrupted = "interrupted"
	evInvalidate  = "invalidate"
	evAwait       = "await"
	evApprove     = "approve"
	evIntent      = "intent"
	evConfirm     = "confirm"
	evUnconfirmed = "unconfirmed"
	evResolve     = "resolve"
)

// Record is one line of logs/ledger.jsonl; each field is the JSON field of
// the same name that the package documentation describes (seq, at, ev,
// session, stage, attempt, inputs, outputs, key, class, error, reason,
// note, by, data, prev). Fields that do not apply are omitted. Writers put
// seq, at and ev first and prev last; readers accept any order and ignore
// unknown fields.
type Record struct {
	Seq     int64             `json:"seq"`
	At      time.Time         `json:"at"`
	Ev      string            `json:"ev"`
	Session string            `json:"session,omitempty"`
	Stage   string            `json:"stage,omitempty"`
	Attempt int               `json:"attempt,omitempty"`
	Inputs  map[string]string `json:"inputs,omitempty"`
	Outputs []Output          `json:"outputs,omitempty"`
	Key     string            `json:"key,omitempty"`
	Class   string            `json:"class,omitempty"`
	Error   string            `json:"error,omitempty"`
	Reason  string            `json:"reason,omitempty"`
	Note    string            `json:"note,omitempty"`
	By      string            `json:"by,omitempty"`
	Data    json.RawMessage   `json:"data,omitempty"`
	Prev    string            `json:"prev"`
}

// Output is a file a stage produced, relative to the run directory, with
// the hex SHA-256 and size it had when the stage completed.
type Output struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// appendRecord encodes r as one ledger line (JSON, the crc field, '\n')
// onto buf. It first cuts r's free text to maxText (cutText), so r is what
// the reader reads back. A record that cannot be encoded, or whose line
// the reader would refuse (longer than maxLine), is an error wrapping
// ErrInvalid, and buf is left as it was.
func appendRecord(buf *bytes.Buffer, r *Record) error {
	r.Error, r.Reason, r.Note, r.By = cutText(r.Error), cutText(r.Reason), cutText(r.Note), cutText(r.By)
	start := buf.Len()
	if encodeRecord(buf, r) {
		return nil
	}
	buf.Truncate(start)
	return appendRecordJSON(buf, r)
}

// appendRecordJSON is appendRecord by encoding/json, after cutText: the
// bytes encodeRecord writes by hand, and the errors of a record that it
// cannot write.
func appendRecordJSON(buf *bytes.Buffer, r *Record) error {
	start := buf.Len()
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil { // Encode writes the trailing '\n'
		buf.Truncate(start)
		return fmt.Errorf("%w: cannot encode the %s record%s: %v; nothing was recorded", ErrInvalid, r.Ev, r.about(), err)
	}
	if n := buf.Len() - start + crcSuffix - 1; n > maxLine {
		buf.Truncate(start)
		return fmt.Errorf("%w: the %s record%s would be a line of %d bytes, more than the %d bytes the reader accepts; nothing was recorded",
			ErrInvalid, r.Ev, r.about(), n, maxLine)
	}
	buf.Truncate(buf.Len() - 2) // "}\n"
	b := buf.AvailableBuffer()
	b = appendCRC(b, buf.Bytes()[start:])
	buf.Write(b)
	buf.WriteByte('\n')
	return nil
}

// about names the stage or effect a record is about, for an error.
func (r *Record) about() string {
	switch {
	case r.Stage != "":
		return fmt.Sprintf(" of stage %q", r.Stage)
	case r.Key != "":
		return fmt.Sprintf(" of effect %q", r.Key)
	}
	return ""
}

// encodeTx appends the records of one transaction to buf and applies them
// to the state. When one cannot be encoded (appendRecord), none is: buf
// and the state are left as they were and the error is returned.
func (r *Run) encodeTx(buf *bytes.Buffer, recs []*Record, now time.Time) error {
	mark, pos := buf.Len(), r.st.pos
	var lastLen int64
	for _, rec := range recs {
		rec.Seq, rec.At, rec.Prev = pos.seq+1, now, pos.hash
		if rec.Session == "" {
			rec.Session = r.session
		}
		n := buf.Len()
		if err := appendRecord(buf, rec); err != nil {
			buf.Truncate(mark)
			return err
		}
		line := buf.Bytes()[n : buf.Len()-1]
		pos = chain{seq: rec.Seq, hash: lineHash(line), offset: pos.offset + int64(len(line)+1), crc: true}
		lastLen = int64(len(line) + 1)
	}
	for _, rec := range recs {
		r.st.apply(rec)
		r.notes.written(rec)
	}
	if len(recs) > 0 {
		r.st.pos, r.st.lastLen = pos, lastLen
	}
	return nil
}

// lineHash is the chain hash of one ledger line without its '\n'.
func lineHash(line []byte) string {
	h := sha256.Sum256(line)
	return hex.EncodeToString(h[:])
}

// parse decodes one line (without '\n') into r and checks the fields
// every record must have. It tries the fast path (decodeFast), with the
// decoder's shared strings, then encoding/json; prev is the chain hash the
// line should name.
//
// Keys are matched exactly: a key given twice, or one that differs from a
// known field only by case, is an error (encoding/json would read it, jq
// would read another field). A line with a crc field must end with it, as
// written, and match it (checkCRC).
func (d *decoder) parse(line []byte, prev string, r *Record) error {
	return d.parseChecked(line, prev, r, lineFacts{})
}

// lineFacts are what replay's line source found out about a line (without
// its '\n') ahead of decoding, on another core (lines.go): its hash
// always, the rest when ahead is set.
type lineFacts struct {
	hash  string // lineHash
	ahead bool   // crc and plain hold
	crc   bool   // crcOK: the line ends with a crc field, as written, that matches
	plain bool   // plainLine
}

// factsAhead lets the line source compute crc and plain ahead (tests and
// BenchmarkReplayFactsAhead turn it off to compare both ways).
var factsAhead = true

// factsOf computes lineFacts for line (without its '\n').
func factsOf(line []byte) lineFacts {
	if !factsAhead {
		return lineFacts{hash: lineHash(line)}
	}
	return lineFacts{hash: lineHash(line), ahead: true, crc: crcOK(line), plain: plainLine(line)}
}

// parseChecked is parse for a line whose facts the caller has: with them
// ahead, the checksum and plainLine are not computed again. facts.hash is
// not used.
func (d *decoder) parseChecked(line []byte, prev string, r *Record, facts lineFacts) error {
	*r = Record{}
	d.crc = false
	if !facts.ahead {
		facts.plain = plainLine(line)
	}
	if !d.decodeFastPlain(line, prev, r, facts.plain) {
		*r = Record{}
		if err := json.Unmarshal(line, r); err != nil {
			return fmt.Errorf("not a JSON record: %v", err)
		}
		crc, err := checkLine(line)
		if err != nil {
			return fmt.Errorf("not a ledger record: %v", err)
		}
		d.crc = crc
	}
	if d.crc && !(facts.ahead && facts.crc) {
		if err := checkCRC(line); err != nil {
			return err
		}
	}
	if r.Seq <= 0 {
		return errors.New("record has no seq")
	}
	if r.Ev == "" {
		return errors.New("record has no ev")
	}
	if r.Attempt < 0 || r.Attempt > maxAttempt {
		return fmt.Errorf("attempt %d is out of range (1 to %d)", r.Attempt, maxAttempt)
	}
	for _, o := range r.Outputs {
		if o.Size < 0 {
			return fmt.Errorf("output %q has a negative size (%d)", o.Path, o.Size)
		}
	}
	return nil
}

// maxAttempt is the largest attempt number a record may hold: the most
// an int of 32 bits holds (decodeFast reads no more). Encoding/json, the
// other path, would read more on 64 bits, and negative numbers.
const maxAttempt = 1<<31 - 1

// chain is the position of a reader or writer in the ledger: the last good
// record and where it ends.
type chain struct {
	seq    int64  // seq of the last record; 0 before the first
	hash   string // chain hash of the last record's line; "" before the first
	offset int64  // byte offset just past the last record's '\n'
	crc    bool   // the last record's line has a crc field: the next one must have one too
}

// replay reads ledger lines from r, which starts at byte offset c.offset,
// checks each one continues the chain (seq+1, prev = hash of the line
// before) and calls apply for it. It stops at the end of r.
//
// A last line without '\n', however long, is a torn write: replay returns
// its start in tornAt (-1 when there is none) and does not apply it. Any
// bad line that ends in '\n', the last one too, is corruption (a torn
// append cannot end in '\n': the writer wrote it whole and may have
// acknowledged it), and so is a line longer than maxLine that ends in
// '\n': replay returns a *CorruptError naming path, the line and its byte
// offset, and c stays at the last good record. The *Record passed to apply is reused for the
// next line: apply must not keep it (the maps and slices in it are new
// for each line and may be kept).
func replay(r io.Reader, path string, c *chain, apply func(*Record, []byte) error) (tornAt int64, err error) {
	src := newLineSource(r)
	defer src.stop()
	p := replayer{path: path, c: c, apply: apply}
	for {
		line, facts, rerr := src.next()
		if rerr == errLineTooLong {
			return -1, &CorruptError{Path: path, Line: int(c.seq + 1), Offset: c.offset,
				Err: fmt.Errorf("line longer than %d bytes (16 MiB, the most a writer writes) and ended by its newline, so not a torn append", maxLine)}
		}
		if rerr == io.EOF && len(line) > 0 || rerr == errTornTooLong {
			return c.offset, nil // no '\n': torn
		}
		if rerr == io.EOF {
			return -1, nil
		}
		if rerr != nil {
			return -1, fmt.Errorf("runstate: read %s: %w", path, rerr)
		}
		if err := p.step(line[:len(line)-1], facts); err != nil {
			return -1, err
		}
	}
}

// replayer checks ledger lines, from a file or from any Store, one at a
// time: each must continue the chain c (seq+1, prev = hash of the line
// before, a crc field after a line with one); apply gets each record that
// does. It is the one place where a line becomes a record of the state.
type replayer struct {
	path  string // the ledger (or the store) the lines come from, for errors
	c     *chain
	apply func(*Record, []byte) error
	d     decoder
	rec   Record
}

// line checks and applies one line without its '\n'.
func (p *replayer) line(body []byte) error { return p.step(body, lineFacts{hash: lineHash(body)}) }

// step is line for a line whose facts (its chain hash, maybe more: see
// parseChecked) are known.
func (p *replayer) step(body []byte, facts lineFacts) error {
	c := p.c
	if perr := p.d.parseChecked(body, c.hash, &p.rec, facts); perr != nil {
		return dosLineEnd(body, &CorruptError{Path: p.path, Line: int(c.seq + 1), Offset: c.offset, Err: perr})
	}
	if c.crc && !p.d.crc {
		return dosLineEnd(body, &CorruptError{Path: p.path, Line: int(c.seq + 1), Offset: c.offset,
			Err: errors.New(`no "crc" field, though the line before has one (the field was damaged or removed?)`)})
	}
	if err := c.check(p.path, &p.rec); err != nil {
		return dosLineEnd(body, err)
	}
	if p.apply != nil {
		if err := p.apply(&p.rec, body); err != nil {
			return err
		}
	}
	c.seq = p.rec.Seq
	c.hash = facts.hash
	c.offset += int64(len(body) + 1)
	c.crc = p.d.crc
	return nil
}

// errCRLF is wrapped by the CorruptError for a bad line that ends in CR
// LF: the ledger was converted to DOS line endings, not damaged.
var errCRLF = errors.New("ends in CR LF: the file was converted to DOS line endings (an editor, git autocrlf, a Windows copy)")

// dosLineEnd is err, the error for the bad line body, telling that body
// ends in '\r' (errCRLF) when it does: the error the line gets otherwise
// (its crc, its JSON, its hash) would send a person to restore or cut a
// ledger that only needs converting back.
func dosLineEnd(body []byte, err error) error {
	var ce *CorruptError
	if len(body) == 0 || body[len(body)-1] != '\r' || !errors.As(err, &ce) {
		return err
	}
	ce.Err = fmt.Errorf("%w; %s and run verify", errCRLF, crlfFix(ce.Path))
	return ce
}

// crlfFix says how to convert the file at path back to LF line endings.
func crlfFix(path string) string {
	p := escape.Arg(path)
	return `convert it back (e.g. sed -i 's/\r$//' ` + p + " or dos2unix " + p + ")"
}

// position is c as a Store's Position, with lastLen the last line's length.
func (c chain) position(lastLen int64) Position {
	return Position{Seq: c.seq, Hash: c.hash, End: c.offset, LastLen: lastLen, CRC: c.crc}
}

// chainAt is the chain at p.
func chainAt(p Position) chain { return chain{seq: p.Seq, hash: p.Hash, offset: p.End, crc: p.CRC} }

// errBrokenChain is wrapped by the CorruptError for a prev hash that does
// not match the line before: that line, most likely, is the one edited.
var errBrokenChain = errors.New("prev hash does not match")

// check verifies that rec continues the chain c.
func (c *chain) check(path string, rec *Record) error {
	line := int(c.seq + 1)
	if rec.Seq != c.seq+1 {
		what := "seq out of order"
		if rec.Seq > c.seq+1 {
			what = fmt.Sprintf("seq gap: %d follows %d (a line was deleted?)", rec.Seq, c.seq)
		} else {
			what = fmt.Sprintf("seq %d follows %d (a line was repeated or moved?)", rec.Seq, c.seq)
		}
		return &CorruptError{Path: path, Line: line, Offset: c.offset, Err: errors.New(what)}
	}
	if rec.Prev != c.hash {
		if c.seq == 0 {
			return &CorruptError{Path: path, Line: line, Offset: c.offset, Err: errors.New("first record has a prev hash (the file does not start at seq 1)")}
		}
		return &CorruptError{Path: path, Line: line, Offset: c.offset, Err: fmt.Errorf("%w line %d (edited or truncated?)", errBrokenChain, c.seq)}
	}
	if rec.Seq == 1 {
		if rec.Ev != evCreate {
			return &CorruptError{Path: path, Line: 1, Offset: 0, Err: fmt.Errorf("first record is %q, want \"create\"", rec.Ev)}
		}
		var id runIdentity
		if err := json.Unmarshal(rec.Data, &id); err != nil {
			return &CorruptError{Path: path, Line: 1, Offset: 0, Err: fmt.Errorf("create record: %v", err)}
		}
		if id.Format != FormatVersion {
			return fmt.Errorf("%w: %s was written in format %d; this runstate reads format %d: use a runstate release that supports format %d",
				ErrVersion, path, id.Format, FormatVersion, id.Format)
		}
	}
	return nil
}

// verifyAdvice is what a *CorruptError tells a person to run: Verify on
// the run directory whose ledger (or journal) Path names (and repair, for
// a torn tail), or on the store's address (Run: repair takes no address),
// by the absolute path or the address quoted for a shell (dirArg), as the
// handoff names it; where neither is known (a store that no command
// reads, or an error that did not pass corruptIn), the function that
// verifies any store.
func (e *CorruptError) verifyAdvice() string {
	if e.Run != "" {
		// A store's address: runstate repair works on run directories
		// only.
		return "runstate verify " + dirArg(e.Run) + " lists every problem"
	}
	run := runDirOf(e.Path)
	if run == "" {
		return "runstate.VerifyStore lists every problem"
	}
	if errors.As(e.Err, new(*lostRecords)) {
		return "runstate verify " + dirArg(run) + " lists every problem" // the error says what repair does
	}
	return "runstate verify " + dirArg(run) + " lists every problem, runstate repair only cuts a torn tail"
}

// runDirOf is the run directory whose ledger or journal is the file at
// path; "" when path is neither (a store's String).
func runDirOf(path string) string {
	slashed := filepath.ToSlash(path)
	for _, f := range []string{ledgerFile, walFile} {
		if slashed == f {
			return "."
		}
		if dir, ok := strings.CutSuffix(slashed, "/"+f); ok {
			return filepath.FromSlash(dir + "/")
		}
	}
	return ""
}

// corruptIn names the run in s (its Addresser.Address) in a *CorruptError
// that err holds, so that its advice runs Verify on the store's address.
func corruptIn(s Store, err error) error {
	var ce *CorruptError
	if a, ok := s.(Addresser); ok && errors.As(err, &ce) && ce.Run == "" {
		ce.Run = a.Address()
	}
	return err
}
