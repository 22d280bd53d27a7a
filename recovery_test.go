package runstate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// buildRun writes a closed run with a plan, outputs, a failure and a retry:
//
//	1 create, 2 open, 3 plan, 4 begin a, 5 complete a, 6 begin b, 7 fail b,
//	8 begin b, 9 complete b, 10 begin c, 11 complete c, 12 close
func buildRun(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	require.NoError(t, r.Do(ctx, "a", writeStage("artifacts/a.txt", "alpha")))
	require.Error(t, r.Do(ctx, "b", func(context.Context, *runstate.Stage) error { return errors.New("flaky") }))
	require.NoError(t, r.Do(ctx, "b", writeStage("artifacts/b.txt", "beta"), runstate.After("a")))
	require.NoError(t, r.Do(ctx, "c", func(_ context.Context, st *runstate.Stage) error {
		for i := 0; i < 3; i++ {
			if err := st.WriteFile(fmt.Sprintf("artifacts/c/%d.txt", i), []byte(strings.Repeat("c", i+1))); err != nil {
				return err
			}
		}
		return nil
	}, runstate.Value("model", "m-1"), runstate.After("b")))
	require.NoError(t, r.Close())
	require.Equal(t, 12, len(parseLedger(t, readLedgerBytes(t, dir))))
	return dir
}

// splitLines splits a ledger into its lines, each with its '\n'.
func splitLines(data []byte) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			out = append(out, data)
			break
		}
		out = append(out, data[:i+1])
		data = data[i+1:]
	}
	return out
}

var (
	seqField  = regexp.MustCompile(`^\{"seq":\d+,`)
	prevField = regexp.MustCompile(`"prev":"[0-9a-f]*"`)
)

// rechain renumbers nothing but rewrites every prev so that the chain
// holds again: corruption that a hash chain alone cannot see (a seq gap, a
// wrong first record) stays for the other checks to find.
func rechain(lines [][]byte) []byte {
	var buf bytes.Buffer
	prev := ""
	for _, l := range lines {
		body := bytes.TrimSuffix(l, []byte("\n"))
		body = recrc(prevField.ReplaceAll(body, []byte(`"prev":"`+prev+`"`)))
		buf.Write(body)
		buf.WriteByte('\n')
		prev = sha256Hex(body)
	}
	return buf.Bytes()
}

var crcField = regexp.MustCompile(`,"crc":"[0-9a-f]{8}"\}$`)

// recrc writes a new checksum into body (a line without '\n') that has
// one, as the writer computes it: the CRC-32C of the bytes before the
// crc field.
func recrc(body []byte) []byte {
	loc := crcField.FindIndex(body)
	if loc == nil {
		return body
	}
	sum := crc32.Checksum(body[:loc[0]], crc32.MakeTable(crc32.Castagnoli))
	return fmt.Appendf(append([]byte(nil), body[:loc[0]]...), `,"crc":"%08x"}`, sum)
}

// recrcLine is recrc for a line with its '\n'.
func recrcLine(line []byte) []byte {
	return append(recrc(bytes.TrimSuffix(line, []byte("\n"))), '\n')
}

func setSeq(line []byte, seq int) []byte {
	return seqField.ReplaceAll(line, []byte(`{"seq":`+strconv.Itoa(seq)+`,`))
}

// editLines applies fn to the ledger's lines and writes the result.
func editLines(path string, fn func([][]byte) []byte) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, fn(splitLines(data)), 0o644)
}

func joinLines(lines [][]byte) []byte { return bytes.Join(lines, nil) }

// fileStates records every file under dir (content hash and mode), so a
// test can check that a refused call touched nothing.
func fileStates(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[rel] = "dir " + fi.Mode().String()
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[rel] = fmt.Sprintf("%s %d %s %s", fi.Mode(), fi.Size(), fi.ModTime().UTC().Format("15:04:05.000000000"), sha256Hex(data))
		return nil
	}))
	return out
}

// TestRecoveryRefusesCorruption damages the ledger of a closed run in the
// ways the package doc (doc.go) calls corruption. Each must be refused by Open with a
// *CorruptError naming the file, line and byte offset, wrapping ErrCorrupt,
// and nothing may be written. Verify must report the same place.
func TestRecoveryRefusesCorruption(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(path string) error
		line    int    // the line reported
		what    string // in the message
	}{
		{
			name: "bad middle line",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { l[4] = []byte("this is not a record\n"); return joinLines(l) })
			},
			line: 5, what: "not a JSON record",
		},
		{
			name: "zeros in the middle (lost blocks)",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[5] = append(make([]byte, len(l[5])-1), '\n')
					return joinLines(l)
				})
			},
			line: 6, what: "not a JSON record",
		},
		{
			name: "middle line cut short",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { l[6] = append(l[6][:len(l[6])/2], '\n'); return joinLines(l) })
			},
			line: 7, what: "not a JSON record",
		},
		{
			name: "two lines run together",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { l[3] = bytes.TrimSuffix(l[3], []byte("\n")); return joinLines(l) })
			},
			line: 4, what: "not a JSON record",
		},
		{
			name: "record without seq",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[3] = []byte(`{"ev":"begin","stage":"a","prev":""}` + "\n")
					return joinLines(l)
				})
			},
			line: 4, what: "no seq",
		},
		{
			name: "seq gap, chain intact",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					for i := 5; i < len(l); i++ {
						l[i] = setSeq(l[i], i+2)
					}
					return rechain(l)
				})
			},
			line: 6, what: "seq gap: 7 follows 5",
		},
		{
			name: "edited value breaks the chain",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[4] = recrcLine(bytes.Replace(l[4], []byte("artifacts/a.txt"), []byte("artifacts/z.txt"), 1))
					return joinLines(l)
				})
			},
			line: 6, what: "prev hash does not match line 5",
		},
		{
			name: "edited value, its checksum not updated",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[4] = bytes.Replace(l[4], []byte("artifacts/a.txt"), []byte("artifacts/z.txt"), 1)
					return joinLines(l)
				})
			},
			line: 5, what: "checksum",
		},
		{
			name: "edited last line",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[11] = recrcLine(bytes.Replace(l[11], []byte(`"ev":"close"`), []byte(`"ev":"clone"`), 1))
					l[10] = recrcLine(bytes.Replace(l[10], []byte(`"stage":"c"`), []byte(`"stage":"d"`), 1))
					return joinLines(l)
				})
			},
			line: 12, what: "prev hash does not match line 11",
		},
		{
			name: "deleted line",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { return joinLines(append(l[:6:6], l[7:]...)) })
			},
			line: 7, what: "seq gap: 8 follows 6",
		},
		{
			name: "deleted line, rechained",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { return rechain(append(l[:6:6], l[7:]...)) })
			},
			line: 7, what: "seq gap",
		},
		{
			name: "repeated line",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { return joinLines(append(l[:7:7], l[6:]...)) })
			},
			line: 8, what: "seq 7 follows 7",
		},
		{
			name: "swapped lines",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { l[5], l[6] = l[6], l[5]; return joinLines(l) })
			},
			line: 6, what: "seq gap",
		},
		{
			name: "first line deleted, renumbered and rechained",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l = l[1:]
					for i := range l {
						l[i] = setSeq(l[i], i+1)
					}
					return rechain(l)
				})
			},
			line: 1, what: `first record is "open"`,
		},
		{
			name: "first line has a prev",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[0] = recrcLine(prevField.ReplaceAll(l[0], []byte(`"prev":"`+strings.Repeat("ab", 32)+`"`)))
					return joinLines(l)
				})
			},
			line: 1, what: "first record has a prev",
		},
	}
	base := buildRun(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
			lp := ledgerPath(dir)
			require.NoError(t, tt.corrupt(lp))
			// Without a snapshot, Open replays (and checks) every line.
			require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
			data := readLedgerBytes(t, dir)
			lines := splitLines(data)
			require.Greater(t, len(lines), tt.line-1)
			var wantOffset int64
			for _, l := range lines[:tt.line-1] {
				wantOffset += int64(len(l))
			}
			before := fileStates(t, dir)

			checkCorrupt := func(what string, err error) {
				t.Helper()
				require.Error(t, err, what)
				assert.ErrorIs(t, err, runstate.ErrCorrupt, what)
				assert.NotErrorIs(t, err, runstate.ErrVersion, what)
				var ce *runstate.CorruptError
				require.ErrorAs(t, err, &ce, what)
				assert.Equal(t, lp, ce.Path, what)
				assert.Equal(t, tt.line, ce.Line, what)
				assert.Equal(t, wantOffset, ce.Offset, what)
				assert.Contains(t, err.Error(), tt.what, what)
				assert.Contains(t, err.Error(), lp, "%s: the message names the file", what)
				assert.Contains(t, err.Error(), fmt.Sprintf("line %d", tt.line), what)
				assert.Contains(t, err.Error(), "runstate verify", "%s: the message says what to do", what)
			}

			_, err := runstate.Open(dir, testOptions())
			checkCorrupt("Open", err)
			_, err = runstate.Inspect(dir)
			checkCorrupt("Inspect", err)
			n := 0
			err = runstate.ReadLedger(dir, func(*runstate.Record) error { n++; return nil })
			checkCorrupt("ReadLedger", err)
			assert.Equal(t, tt.line-1, n, "ReadLedger passes the good records before the damage")

			rep, err := runstate.Verify(dir)
			require.NoError(t, err)
			require.False(t, rep.OK())
			p := rep.Problems[0]
			assert.Equal(t, lp, p.File)
			assert.Equal(t, tt.line, p.Line)
			assert.Equal(t, wantOffset, p.Offset)
			assert.Contains(t, p.What, tt.what)
			assert.NotEmpty(t, p.Fix)
			assert.Equal(t, int64(tt.line-1), rep.Records)
			assert.Equal(t, wantOffset, rep.Bytes)

			assert.Equal(t, before, fileStates(t, dir), "a refused Open must not touch the run")
			assert.Equal(t, data, readLedgerBytes(t, dir))
		})
	}
}

func TestRecoveryUnknownFormat(t *testing.T) {
	dir := t.TempDir()
	copyFile(t, "testdata/format2.jsonl", ledgerPath(dir))
	ledger := readLedgerBytes(t, dir)

	_, err := runstate.Open(dir, &runstate.Options{Request: "fixture: from the future"})
	require.ErrorIs(t, err, runstate.ErrVersion)
	assert.NotErrorIs(t, err, runstate.ErrCorrupt, "a newer format is not corruption")
	var ce *runstate.CorruptError
	assert.False(t, errors.As(err, &ce))
	assert.Contains(t, err.Error(), ledgerPath(dir))
	assert.Contains(t, err.Error(), "format 2")
	assert.Equal(t, ledger, readLedgerBytes(t, dir), "the ledger is not touched")
	assert.NoFileExists(t, filepath.Join(dir, "manifest.json"))
	assert.NoFileExists(t, filepath.Join(dir, "logs", "next-steps.txt"))

	_, err = runstate.Inspect(dir)
	assert.ErrorIs(t, err, runstate.ErrVersion)
	assert.NotErrorIs(t, err, runstate.ErrCorrupt)
	_, err = runstate.Verify(dir)
	assert.ErrorIs(t, err, runstate.ErrVersion)

	// The same through a ledger this version wrote, its create record
	// edited to format 2 and the chain repaired: still ErrVersion.
	dir = buildRun(t)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	require.NoError(t, editLines(ledgerPath(dir), func(l [][]byte) []byte {
		l[0] = recrcLine(bytes.Replace(l[0], []byte(`"format":1`), []byte(`"format":2`), 1))
		return rechain(l)
	}))
	before := fileStates(t, dir)
	_, err = runstate.Open(dir, testOptions())
	require.ErrorIs(t, err, runstate.ErrVersion)
	assert.NotErrorIs(t, err, runstate.ErrCorrupt)
	assert.Equal(t, before, fileStates(t, dir))
}

// tornBase returns a run whose last record is a complete record (its
// session died right after it: no close), without a manifest, and that
// last line.
func tornBase(t testing.TB) (dir string, last []byte) {
	t.Helper()
	dir = buildRun(t)
	lines := splitLines(readLedgerBytes(t, dir))
	lines = lines[:len(lines)-1] // drop the close: the last record is "complete c"
	require.NoError(t, os.WriteFile(ledgerPath(dir), joinLines(lines), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	last = lines[len(lines)-1]
	require.Contains(t, string(last), `"ev":"complete"`)
	return dir, last
}

// TestRecoveryTornTailEveryOffset cuts the last record at every byte and
// checks that readers ignore the torn tail and Open repairs it: the bytes
// are moved to logs/ledger.jsonl.torn-<time>, the ledger is cut back to the
// last good record, it says so in the log, and the run goes on with a
// chain that holds. The last record is the session's close (the shortest
// kind, to keep this fast); a complete record with outputs is cut at a
// sample of offsets.
func TestRecoveryTornTailEveryOffset(t *testing.T) {
	t.Run("close record, every byte", func(t *testing.T) {
		base := buildRun(t)
		require.NoError(t, os.Remove(filepath.Join(base, "manifest.json")))
		cutEveryOffset(t, base, 1)
	})
	t.Run("complete record, sampled", func(t *testing.T) {
		base, _ := tornBase(t)
		cutEveryOffset(t, base, 23)
	})
}

// cutEveryOffset cuts the last record of the ledger in base at every
// step-th byte (and its last byte) and checks the repair, reusing one copy
// of the run.
func cutEveryOffset(t *testing.T, base string, step int) {
	data := readLedgerBytes(t, base)
	lines := splitLines(data)
	last := lines[len(lines)-1]
	good := data[:len(data)-len(last)]
	body := bytes.TrimSuffix(last, []byte("\n"))
	goodLines := parseLedger(t, good)
	lastGood := goodLines[len(goodLines)-1]
	dir := t.TempDir()
	require.NoError(t, os.CopyFS(dir, os.DirFS(base)))

	for k := 1; k <= len(body); k++ {
		if k%step != 0 && k != len(body) {
			continue
		}
		// Every 64th cut, the run also goes on and verifies.
		full := k%64 == 1 || k == len(body)
		saved, _ := filepath.Glob(ledgerPath(dir) + ".torn-*")
		for _, p := range append(saved, filepath.Join(dir, "manifest.json"), filepath.Join(dir, "logs", "next-steps.txt")) {
			require.NoError(t, os.RemoveAll(p))
		}
		torn := body[:k]
		require.NoError(t, os.WriteFile(ledgerPath(dir), append(bytes.Clone(good), torn...), 0o644))
		if !checkTornRepair(t, dir, good, torn, lastGood, full, fmt.Sprintf("cut at byte %d of %d", k, len(body))) {
			return
		}
	}
}

// TestRecoveryTornTailOther covers the other shapes of a torn last line:
// garbage and zeros (a file system that extended the file before the data
// reached it), and one longer than a line may be, without a newline.
// (With one, the line is corruption:
// TestLastLineEndingInNewlineIsCorruptNotTorn.)
func TestRecoveryTornTailOther(t *testing.T) {
	base, last := tornBase(t)
	good := readLedgerBytes(t, base)
	lastGood := parseLedger(t, good)
	for name, torn := range map[string][]byte{
		"garbage":     []byte("{\"seq\":12,\"at\":\"garb"),
		"zeros":       make([]byte, 4096),
		"half a line": bytes.Clone(last[:len(last)/2]),
		// A big record cut short, with more bytes than the 16 MiB a
		// line may take: still a torn tail, not a line too long.
		"longer than the line limit": append(bytes.Clone(last[:len(last)/2]), bytes.Repeat([]byte("x"), 17<<20)...),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
			require.NoError(t, os.WriteFile(ledgerPath(dir), append(bytes.Clone(good), torn...), 0o644))
			checkTornRepair(t, dir, good, torn, lastGood[len(lastGood)-1], true, name)
		})
	}
}

// checkTornRepair checks readers and Open on dir, whose ledger is good
// followed by the torn bytes.
func checkTornRepair(t *testing.T, dir string, good, torn []byte, lastGood ledgerLine, full bool, what string) bool {
	t.Helper()
	ctx := context.Background()
	lp := ledgerPath(dir)
	withTorn := append(bytes.Clone(good), torn...)

	// Readers ignore the torn tail and write nothing.
	st, err := runstate.Inspect(dir)
	if !assert.NoError(t, err, what) {
		return false
	}
	assert.Equal(t, lastGood.rec.Seq, st.Seq, what)
	assert.Equal(t, int64(len(torn)), st.Torn, what)
	n := 0
	require.NoError(t, runstate.ReadLedger(dir, func(*runstate.Record) error { n++; return nil }), what)
	assert.Equal(t, int(lastGood.rec.Seq), n, what)
	if full {
		rep, err := runstate.Verify(dir)
		require.NoError(t, err, what)
		require.NotEmpty(t, rep.Problems, what)
		assert.Contains(t, rep.Problems[0].What, "torn", what)
	}
	assert.Equal(t, withTorn, readLedgerBytes(t, dir), "%s: readers must not repair", what)

	// A writer repairs it.
	logs := &syncBuffer{}
	opts := testOptions()
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r, err := runstate.Open(dir, opts)
	if !assert.NoError(t, err, what) {
		return false
	}
	defer r.Close()
	assert.Contains(t, logs.String(), "torn", "%s: the repair is logged", what)
	saved, err := filepath.Glob(lp + ".torn-*")
	require.NoError(t, err)
	if assert.Len(t, saved, 1, what) {
		data, err := os.ReadFile(saved[0])
		require.NoError(t, err)
		assert.Equal(t, torn, data, "%s: the torn bytes are kept aside", what)
	}
	after := readLedgerBytes(t, dir)
	if !assert.True(t, bytes.HasPrefix(after, good), "%s: every good record is kept", what) {
		return false
	}
	next := parseLedger(t, after[len(good):])
	require.NotEmpty(t, next, what)
	assert.Equal(t, lastGood.rec.Seq+1, next[0].rec.Seq, "%s: seq continues after the last good record", what)
	assert.Equal(t, sha256Hex(lastGood.raw), next[0].rec.Prev, "%s: the chain continues", what)

	if !full {
		return assert.NoError(t, r.Close(), what)
	}
	require.NoError(t, r.Do(ctx, "d", writeStage("artifacts/d.txt", "delta"), runstate.After("b")), what)
	require.NoError(t, r.Close(), what)
	checkLedger(t, dir)
	rep, err := runstate.Verify(dir)
	require.NoError(t, err, what)
	return assert.True(t, rep.OK(), "%s: %v", what, rep.Problems)
}

// snapshotRun builds a run whose manifest.json is a valid snapshot that is
// behind the ledger: it reflects line snapSeq; later lines are the tail
// Open replays.
func snapshotRun(t testing.TB) (dir string, snapSeq int64) {
	t.Helper()
	ctx := context.Background()
	dir = buildRun(t)
	m := readManifest(t, dir)
	saved, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Plan(ctx, "a", "b", "c", "d", "e"))
	require.NoError(t, r.Do(ctx, "d", writeStage("artifacts/d.txt", "delta")))
	require.NoError(t, r.Do(ctx, "e", writeStage("artifacts/e.txt", "epsilon")))
	require.NoError(t, r.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "manifest.json"), saved, 0o644))
	require.Equal(t, int64(12), m.Seq)
	require.Equal(t, 19, len(parseLedger(t, readLedgerBytes(t, dir))))
	return dir, m.Seq
}

// TestRecoverySnapshotTail: with a valid snapshot, Open checks the record
// it names and every line after it.
func TestRecoverySnapshotTail(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(path string) error
		line    int
	}{
		{
			name: "edited value in the tail",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[15] = recrcLine(bytes.Replace(l[15], []byte("artifacts/d.txt"), []byte("artifacts/x.txt"), 1))
					return joinLines(l)
				})
			},
			line: 17,
		},
		{
			name: "bad line in the tail",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { l[14] = []byte("{oops}\n"); return joinLines(l) })
			},
			line: 15,
		},
		{
			name: "deleted line in the tail",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte { return joinLines(append(l[:16:16], l[17:]...)) })
			},
			line: 17,
		},
		{
			name: "the snapshot's own record edited",
			corrupt: func(p string) error {
				return editLines(p, func(l [][]byte) []byte {
					l[11] = recrcLine(bytes.Replace(l[11], []byte(`"ev":"close"`), []byte(`"ev":"clone"`), 1))
					return joinLines(l)
				})
			},
			line: 13, // the snapshot no longer holds: a full replay finds line 13's prev wrong
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, _ := snapshotRun(t)
			lp := ledgerPath(dir)
			require.NoError(t, tt.corrupt(lp))
			before := fileStates(t, dir)
			_, err := runstate.Open(dir, testOptions())
			require.ErrorIs(t, err, runstate.ErrCorrupt)
			var ce *runstate.CorruptError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, lp, ce.Path)
			assert.Equal(t, tt.line, ce.Line)
			assert.Equal(t, before, fileStates(t, dir), "nothing written")
			_, err = runstate.Inspect(dir)
			assert.ErrorIs(t, err, runstate.ErrCorrupt)
			rep, err := runstate.Verify(dir)
			require.NoError(t, err)
			require.False(t, rep.OK())
			assert.Equal(t, tt.line, rep.Problems[0].Line)
		})
	}

	t.Run("torn tail", func(t *testing.T) {
		dir, _ := snapshotRun(t)
		data := readLedgerBytes(t, dir)
		lines := splitLines(data)
		last := lines[len(lines)-1]
		good := data[:len(data)-len(last)]
		goodLines := parseLedger(t, good)
		for _, k := range []int{1, len(last) / 3, len(last) - 1} {
			d := t.TempDir()
			require.NoError(t, os.CopyFS(d, os.DirFS(dir)))
			require.NoError(t, os.WriteFile(ledgerPath(d), append(bytes.Clone(good), last[:k]...), 0o644))
			checkTornRepair(t, d, good, last[:k], goodLines[len(goodLines)-1], true, fmt.Sprintf("snapshot, cut at %d", k))
		}
	})
}

// TestRecoverySnapshotTrusted: damage before the snapshot, in place, is
// not seen by Open (it trusts the snapshot, as SQLite trusts its file on
// open); Verify checks every line and finds it.
func TestRecoverySnapshotTrusted(t *testing.T) {
	dir, snapSeq := snapshotRun(t)
	lp := ledgerPath(dir)
	require.NoError(t, editLines(lp, func(l [][]byte) []byte {
		l[4] = recrcLine(bytes.Replace(l[4], []byte("artifacts/a.txt"), []byte("artifacts/z.txt"), 1))
		return joinLines(l)
	}))
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	require.False(t, rep.OK())
	assert.Equal(t, 6, rep.Problems[0].Line)
	assert.Contains(t, rep.Problems[0].What, "prev hash")
	assert.Less(t, int64(6), snapSeq+1)

	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err, "Open checks from the snapshot on")
	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c", "d", "e"}, s.Plan)
	e, _ := s.Stage("e")
	assert.Equal(t, runstate.StateComplete, e.State, "the tail after the snapshot was applied")
	require.NoError(t, r.Close())
}

// TestRecoveryManifestMismatchIgnored: a manifest whose recorded hash does
// not match the ledger's record at that position is not a snapshot of this
// ledger: Open and Inspect replay it all.
func TestRecoveryManifestMismatchIgnored(t *testing.T) {
	t.Run("the snapshot's record rewritten, chain repaired", func(t *testing.T) {
		// The ledger is valid on its own, but its line 12 is not the line
		// the manifest hashed. Trusting the manifest would check line 13
		// against the old hash and fail; ignoring it replays everything.
		dir, snapSeq := snapshotRun(t)
		require.NoError(t, editLines(ledgerPath(dir), func(l [][]byte) []byte {
			l[snapSeq-1] = bytes.Replace(l[snapSeq-1], []byte(`"ev":"close"`), []byte(`"ev":"clos2"`), 1)
			return rechain(l)
		}))
		st, err := runstate.Inspect(dir)
		require.NoError(t, err, "Inspect must not trust the manifest")
		assert.Equal(t, int64(19), st.Seq)
		r := openRun(t, dir, testOptions())
		s, err := r.Status()
		require.NoError(t, err)
		assert.Equal(t, []string{"a", "b", "c", "d", "e"}, s.Plan)
		assert.Equal(t, 5, s.Done)
		require.NoError(t, r.Close())
		assert.Equal(t, lastRecord(t, dir).Seq, readManifest(t, dir).Seq, "the manifest is rebuilt")
	})
	t.Run("the manifest of another run", func(t *testing.T) {
		dir, _ := snapshotRun(t)
		other := buildRun(t)
		copyFile(t, filepath.Join(other, "manifest.json"), filepath.Join(dir, "manifest.json"))
		want, err := runstate.Verify(dir)
		require.NoError(t, err)
		assert.False(t, want.OK(), "Verify says the manifest does not reflect the ledger")
		r := openRun(t, dir, testOptions())
		s, err := r.Status()
		require.NoError(t, err)
		assert.NotEqual(t, readManifest(t, other).ID, s.ID)
		assert.Equal(t, lastRecord(t, dir).Seq, s.Seq)
		assert.Equal(t, []string{"a", "b", "c", "d", "e"}, s.Plan)
	})
	t.Run("the ledger cut back past the snapshot", func(t *testing.T) {
		dir, _ := snapshotRun(t)
		// Put the newest manifest back, then cut the ledger's last two
		// records cleanly: the manifest names a record that is gone.
		r := openRun(t, dir, testOptions())
		require.NoError(t, r.Close())
		require.NoError(t, editLines(ledgerPath(dir), func(l [][]byte) []byte { return joinLines(l[:len(l)-2]) }))
		st, err := runstate.Inspect(dir)
		require.NoError(t, err)
		assert.Equal(t, int64(19), st.Seq)
	})
}

// TestRecoveryManifestEditedIgnored: a manifest edited by hand is not
// trusted: Open replays the ledger.
func TestRecoveryManifestEditedIgnored(t *testing.T) {
	mangle := map[string]func(m map[string]any){
		"other hash": func(m map[string]any) {
			m["ledger"].(map[string]any)["hash"] = strings.Repeat("0", 64)
		},
		"past the end": func(m map[string]any) {
			l := m["ledger"].(map[string]any)
			l["end"] = l["end"].(float64) + 1e6
			l["offset"] = l["offset"].(float64) + 1e6
		},
		"mid-line offset": func(m map[string]any) {
			l := m["ledger"].(map[string]any)
			l["offset"] = l["offset"].(float64) + 3
		},
	}
	for name, fn := range mangle {
		t.Run(name, func(t *testing.T) {
			dir, _ := snapshotRun(t)
			mp := filepath.Join(dir, "manifest.json")
			data, err := os.ReadFile(mp)
			require.NoError(t, err)
			var m map[string]any
			require.NoError(t, jsonUnmarshal(data, &m))
			fn(m)
			m["plan"] = []string{"bogus"} // would show if the manifest were trusted
			for _, s := range m["stages"].([]any) {
				s.(map[string]any)["state"] = "fatal"
			}
			require.NoError(t, os.WriteFile(mp, jsonMarshal(t, m), 0o644))

			st, err := runstate.Inspect(dir)
			require.NoError(t, err)
			assert.Equal(t, []string{"a", "b", "c", "d", "e"}, st.Plan, "Inspect replays the ledger")
			r := openRun(t, dir, testOptions())
			s, err := r.Status()
			require.NoError(t, err)
			assert.Equal(t, []string{"a", "b", "c", "d", "e"}, s.Plan, "Open replays the ledger")
			for _, ss := range s.Stages {
				assert.Equal(t, runstate.StateComplete, ss.State, ss.Name)
			}
			require.NoError(t, r.Close())

			// And with damage before the (ignored) snapshot, the full
			// replay finds it.
			require.NoError(t, os.WriteFile(mp, jsonMarshal(t, m), 0o644))
			require.NoError(t, editLines(ledgerPath(dir), func(l [][]byte) []byte {
				l[4] = recrcLine(bytes.Replace(l[4], []byte("artifacts/a.txt"), []byte("artifacts/z.txt"), 1))
				return joinLines(l)
			}))
			_, err = runstate.Open(dir, testOptions())
			var ce *runstate.CorruptError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, 6, ce.Line)
		})
	}
}

func jsonUnmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

func jsonMarshal(t testing.TB, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	return data
}

// TestRecoveryTornCreate: a process killed while writing the very first
// record leaves a run that was never created. Readers say so; the next
// Open moves the bytes aside and creates the run.
func TestRecoveryTornCreate(t *testing.T) {
	first := splitLines(readLedgerBytes(t, buildRun(t)))[0]
	for _, k := range []int{1, len(first) / 2, len(first) - 1} {
		dir := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
		require.NoError(t, os.WriteFile(ledgerPath(dir), first[:k], 0o644))
		_, err := runstate.Inspect(dir)
		require.Error(t, err, "cut at %d", k)
		assert.Contains(t, err.Error(), "never created")
		assert.Equal(t, first[:k], readLedgerBytes(t, dir))

		r := openRun(t, dir, testOptions())
		require.NoError(t, r.Close())
		lines := checkLedger(t, dir)
		assert.Equal(t, "create", lines[0].rec.Ev)
		saved, err := filepath.Glob(ledgerPath(dir) + ".torn-*")
		require.NoError(t, err)
		require.Len(t, saved, 1)
		data, err := os.ReadFile(saved[0])
		require.NoError(t, err)
		assert.Equal(t, first[:k], data)
	}
}

// An attempt number no writer records — negative, or past the 2^31-1
// that an int of 32 bits holds — in a line whose chain and checksum hold
// (a hand edit, then rechained) is corruption naming the line, for every
// reader alike. It read: a stage began again at attempt
// -9223372036854775808 (the next one after 2^63-1), or a negative attempt
// counted as done.
func TestRecoveryAttemptOutOfRange(t *testing.T) {
	for _, attempt := range []string{"-1", "2147483648", "9223372036854775807"} {
		t.Run(attempt, func(t *testing.T) {
			dir := buildRun(t)
			require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
			require.NoError(t, editLines(ledgerPath(dir), func(l [][]byte) []byte {
				for _, n := range []int{5, 6} { // 6 begin b, 7 fail b
					l[n] = bytes.Replace(l[n], []byte(`"attempt":1,`), []byte(`"attempt":`+attempt+`,`), 1)
				}
				return rechain(l)
			}))
			ledger := readLedgerBytes(t, dir)

			_, err := runstate.Inspect(dir)
			var ce *runstate.CorruptError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, 6, ce.Line, "%v", err)
			assert.Contains(t, err.Error(), "attempt "+attempt)
			_, err = runstate.Open(dir, testOptions())
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, 6, ce.Line, "%v", err)
			assert.Equal(t, ledger, readLedgerBytes(t, dir), "the ledger is not touched")
		})
	}
}

// A stage at the largest attempt a record holds is not begun again: the
// begin would hold an attempt every reader refuses. Nothing is recorded.
func TestBeginRefusesAnAttemptPastTheLargest(t *testing.T) {
	dir := buildRun(t)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	require.NoError(t, editLines(ledgerPath(dir), func(l [][]byte) []byte {
		for _, n := range []int{5, 6} { // 6 begin b, 7 fail b
			l[n] = bytes.Replace(l[n], []byte(`"attempt":1,`), []byte(`"attempt":2147483647,`), 1)
		}
		return rechain(l[:7]) // b failed at attempt 2^31-1
	}))
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	_, err = r.Begin(context.Background(), "b")
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "stage b has begun 2147483647 times")
	require.NoError(t, r.Close())
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

// An output's negative size in a line whose chain and checksum hold is
// corruption naming the line: no file has it, and Verify and Begin
// compare sizes before they read. encoding/json read it.
func TestRecoveryNegativeOutputSize(t *testing.T) {
	dir := buildRun(t)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	require.NoError(t, editLines(ledgerPath(dir), func(l [][]byte) []byte {
		require.Contains(t, string(l[4]), `"size":5`) // 5 complete a
		l[4] = bytes.Replace(l[4], []byte(`"size":5`), []byte(`"size":-1`), 1)
		return rechain(l)
	}))
	_, err := runstate.Inspect(dir)
	var ce *runstate.CorruptError
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, 5, ce.Line, "%v", err)
	assert.Contains(t, err.Error(), "negative size")
}
