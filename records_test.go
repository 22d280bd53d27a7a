package runstate_test

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// withCRC gives body (a ledger line without '\n') the checksum the writer
// computes, in place of the one it has: the CRC-32C of the bytes before
// ,"crc":", last.
func withCRC(body []byte) []byte {
	if i := bytes.LastIndex(body, []byte(`,"crc":"`)); i >= 0 && len(body)-i == len(`,"crc":"00000000"}`) {
		body = append(body[:i:i], '}')
	}
	n := len(body) - 1 // the closing '}'
	sum := crc32.Checksum(body[:n], crc32.MakeTable(crc32.Castagnoli))
	return fmt.Appendf(append([]byte(nil), body[:n]...), `,"crc":"%08x"}`, sum)
}

// lastLine splits a ledger into the lines before its last one and the
// last one without its '\n'.
func lastLine(t *testing.T, data []byte) (good, last []byte) {
	t.Helper()
	require.True(t, bytes.HasSuffix(data, []byte("\n")))
	i := bytes.LastIndexByte(data[:len(data)-1], '\n') + 1
	return data[:i], data[i : len(data)-1]
}

// assertRefused checks that every reader refuses dir's ledger with a
// *CorruptError at line and offset (containing what), and that Open and
// Repair neither cut it nor write anything.
func assertRefused(t *testing.T, dir string, line int, offset int64, what string) {
	t.Helper()
	lp := ledgerPath(dir)
	data := readLedgerBytes(t, dir)
	before := fileStates(t, dir)
	check := func(who string, err error) {
		t.Helper()
		var ce *runstate.CorruptError
		if !assert.ErrorAs(t, err, &ce, who) {
			return
		}
		assert.Equal(t, lp, ce.Path, who)
		assert.Equal(t, line, ce.Line, who)
		assert.Equal(t, offset, ce.Offset, who)
		assert.Contains(t, err.Error(), what, who)
	}
	_, err := runstate.Open(dir, testOptions())
	check("Open", err)
	_, err = runstate.Inspect(dir)
	check("Inspect", err)
	check("ReadLedger", runstate.ReadLedger(dir, func(*runstate.Record) error { return nil }))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	if assert.False(t, rep.OK(), "Verify") {
		assert.Equal(t, line, rep.Problems[0].Line, "Verify")
		assert.Equal(t, offset, rep.Problems[0].Offset, "Verify")
	}
	_, err = runstate.Repair(dir, nil)
	assert.ErrorIs(t, err, runstate.ErrCorrupt, "Repair")
	assert.Equal(t, data, readLedgerBytes(t, dir), "the acknowledged line is never cut")
	assert.Equal(t, before, fileStates(t, dir), "nothing written")
}

// A last line that ends in '\n' was written whole (a torn append cannot
// end in '\n') and may have been acknowledged: if it does not read, that
// is corruption, refused with its line and offset, never a torn tail cut
// off.
func TestLastLineEndingInNewlineIsCorruptNotTorn(t *testing.T) {
	base := buildRun(t)
	good := readLedgerBytes(t, base)
	_, last := lastLine(t, good)
	for name, tail := range map[string][]byte{
		"garbage":                 []byte("this is not a record\n"),
		"zeros":                   append(make([]byte, 100), '\n'),
		"half a line":             append(bytes.Clone(last[:len(last)/2]), '\n'),
		"a record cut in two":     append(bytes.Clone(last[:len(last)-30]), last[len(last)-10:]...),
		"an unterminated object":  []byte(`{"seq":13,"at":"2026-01-02T03:04:05Z","ev":"note"` + "\n"),
		"a number, not an object": []byte("13\n"),
		"longer than the limit":   append(bytes.Repeat([]byte("x"), 16<<20+1), '\n'),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
			require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
			if !bytes.HasSuffix(tail, []byte("\n")) {
				tail = append(tail, '\n')
			}
			require.NoError(t, os.WriteFile(ledgerPath(dir), append(bytes.Clone(good), tail...), 0o644))
			what := "line 13"
			if len(tail) > 16<<20 {
				what = "longer than 16777216 bytes"
			}
			assertRefused(t, dir, 13, int64(len(good)), what)
		})
	}
}

// A ledger converted to DOS line endings (every line, or every line from
// some on, ends in "\r\n") is refused at its first such line with what
// happened and how to convert it back, not with the crc, JSON or chain
// error the line also has; Verify's fix says so too (not "restore" or
// "cut"), and the ledger converted back verifies.
func TestLedgerWithDOSLineEndings(t *testing.T) {
	base := buildRun(t)
	good := readLedgerBytes(t, base)
	for _, from := range []int{1, 6} { // the first line converted
		t.Run(fmt.Sprintf("from line %d", from), func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
			lines := bytes.SplitAfter(good, []byte("\n"))
			at := int64(len(bytes.Join(lines[:from-1], nil)))
			crlf := append(bytes.Clone(good[:at]), bytes.ReplaceAll(good[at:], []byte("\n"), []byte("\r\n"))...)
			require.NoError(t, os.WriteFile(ledgerPath(dir), crlf, 0o644))
			lp := ledgerPath(dir)
			assertRefused(t, dir, from, at, fmt.Sprintf("line %d (byte %d): ends in CR LF: the file was converted to DOS line endings", from, at))
			_, err := runstate.Open(dir, testOptions())
			require.Error(t, err)
			assert.Contains(t, err.Error(), "dos2unix "+lp)
			assert.Contains(t, err.Error(), `sed -i 's/\r$//' `+lp)
			rep, err := runstate.Verify(dir)
			require.NoError(t, err)
			require.NotEmpty(t, rep.Problems)
			assert.Equal(t, "ends in CR LF: the file was converted to DOS line endings (an editor, git autocrlf, a Windows copy)", rep.Problems[0].What)
			assert.Contains(t, rep.Problems[0].Fix, "dos2unix "+lp)
			assert.NotContains(t, rep.Problems[0].Fix, "cut it")
			_, err = runstate.Repair(dir, nil)
			assert.ErrorContains(t, err, "ends in CR LF")

			require.NoError(t, os.WriteFile(lp, bytes.ReplaceAll(crlf, []byte("\r\n"), []byte("\n")), 0o644))
			assertVerifies(t, dir)
		})
	}
}

// A flipped bit in the last record, which no later record's prev covers,
// is found by the line's checksum: for every byte of the last line but
// its '\n', and two bits of each, every reader refuses the ledger. (Today
// without the checksum, "close" flipped to "clese" reads as an unknown
// event, skipped; a flipped letter in a note reads as another note.)
func TestFlippedBitInLastRecordIsDetected(t *testing.T) {
	dir := buildRun(t)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	data := readLedgerBytes(t, dir)
	good, last := lastLine(t, data)
	lp := ledgerPath(dir)
	missed := 0
	for i := range last {
		for _, bit := range []byte{0x01, 0x20} {
			flipped := bytes.Clone(data)
			flipped[len(good)+i] ^= bit
			require.NoError(t, os.WriteFile(lp, flipped, 0o644))
			rep, err := runstate.Verify(dir)
			require.NoError(t, err)
			if rep.OK() || rep.Problems[0].Line != 12 {
				missed++
				if missed <= 5 {
					t.Errorf("bit %#x of byte %d (%q) of the last line flipped: Verify reports %v", bit, i, last[i], rep.Problems)
				}
			}
		}
	}
	assert.Zero(t, missed, "flipped bits not detected, of %d", 2*len(last))

	// Open and the other readers too, with the line and offset.
	flipped := bytes.Replace(bytes.Clone(data), []byte(`"ev":"close"`), []byte(`"ev":"clese"`), 1)
	require.NoError(t, os.WriteFile(lp, flipped, 0o644))
	assertRefused(t, dir, 12, int64(len(good)), "checksum")
}

// The crc field may be missing only from lines written before runstate
// added it; after a line that has one, a line without it is refused (its
// field was damaged or removed), and so is a crc that is not the line's
// last field as written.
func TestCRCOnceWrittenIsRequired(t *testing.T) {
	base := buildRun(t)
	good, last := lastLine(t, readLedgerBytes(t, base))
	i := bytes.LastIndex(last, []byte(`,"crc":"`))
	require.Positive(t, i)
	for name, line := range map[string][]byte{
		"crc removed":         append(bytes.Clone(last[:i]), '}'),
		"crc renamed":         bytes.Replace(bytes.Clone(last), []byte(`"crc":`), []byte(`"crs":`), 1),
		"crc not last":        append(append(bytes.Clone(last[:len(last)-1]), []byte(`,"x":1`)...), '}'),
		"crc in another case": bytes.Replace(bytes.Clone(last), []byte(`"crc":`), []byte(`"cRc":`), 1),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
			require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
			require.NoError(t, os.WriteFile(ledgerPath(dir), append(append(bytes.Clone(good), line...), '\n'), 0o644))
			assertRefused(t, dir, 12, int64(len(good)), "crc")
		})
	}
}

// TestLedgerKeysMatchExactly: encoding/json matches keys to fields without
// regard to case (and with Unicode folding), and keeps the last of a key
// given twice; jq reads keys exactly. So a chain-valid line with both
// "ev":"fail" and "EV":"complete" would be complete to runstate and a
// failure to jq. Such lines, and keys given twice anywhere in a line, are
// corruption, whichever path (fast or encoding/json) reads them.
func TestLedgerKeysMatchExactly(t *testing.T) {
	base := buildRun(t)
	good, last := lastLine(t, readLedgerBytes(t, base))
	var rec runstate.Record
	require.NoError(t, jsonUnmarshal(last, &rec))
	head := fmt.Sprintf(`{"seq":12,"at":"2026-01-02T03:04:05.5Z",%%s"session":%q,"prev":%q}`, rec.Session, rec.Prev)
	line := func(fields string) []byte { return withCRC([]byte(fmt.Sprintf(head, fields))) }
	cases := map[string]struct {
		line []byte
		what string
	}{
		"ev and EV":             {line(`"ev":"fail","EV":"complete","stage":"c","attempt":2,"class":"retryable","error":"x",`), `"EV" differs from the field "ev" only by case`},
		"Ev first":              {line(`"Ev":"complete","ev":"fail","stage":"c","attempt":2,`), `only by case`},
		"ev twice":              {line(`"ev":"fail","ev":"complete","stage":"c",`), `"ev" given twice`},
		"ev twice, one escaped": {line(`"ev":"fail","\u0065v":"complete","stage":"c",`), `"ev" given twice`},
		"Kelvin sign for k":     {line("\"ev\":\"intent\",\"key\":\"a\",\"\u212aey\":\"b\","), `only by case`},
		"long s for s":          {line("\"ev\":\"fail\",\"stage\":\"c\",\"\u017ftage\":\"d\","), `only by case`},
		"PREV":                  {line(`"ev":"note","PREV":"",`), `only by case`},
		"an output's PATH": {line(`"ev":"complete","stage":"c","attempt":2,"outputs":[{"path":"artifacts/x","PATH":"artifacts/y","sha256":"","size":0}],`),
			`"PATH" differs from the field "path"`},
		"an input twice":      {line(`"ev":"begin","stage":"c","attempt":2,"inputs":{"a":"sha256:1","a":"sha256:2"},`), `"a" given twice`},
		"a key twice in data": {line(`"ev":"confirm","key":"k","data":{"id":1,"id":2},`), `"id" given twice`},
		"a key twice, deeper": {line(`"ev":"confirm","key":"k","data":[{"x":{"id":1,"id":2}}],`), `"id" given twice`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
			require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
			require.NoError(t, os.WriteFile(ledgerPath(dir), append(append(bytes.Clone(good), c.line...), '\n'), 0o644))
			assertRefused(t, dir, 12, int64(len(good)), c.what)
		})
	}

	// Keys that are merely unknown still read (and are ignored), in any
	// case: they are no known field.
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	require.NoError(t, os.WriteFile(ledgerPath(dir), append(append(bytes.Clone(good), line(`"ev":"note","Note2":"x","extra":{"a":1,"A":2},`)...), '\n'), 0o644))
	n := 0
	require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error { n++; return nil }))
	assert.Equal(t, 12, n)
}
