package runstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzRecordRoundTrip: a record the writer encodes is read back equal,
// and a chain of them replays with every hash matching. Strings the
// writer would mangle (invalid UTF-8, which JSON turns into U+FFFD) are
// refused by the API before they reach a record, where they name
// something the run must find again: a stage, an effect key.
func FuzzRecordRoundTrip(f *testing.F) {
	f.Add(int64(1), int64(1700000000123456789), "create", "s", "", "", 0, "", "", []byte(`{"id":"x","request":"r","format":1}`), "", int64(0))
	f.Add(int64(7), int64(0), "complete", "stage/1", "", "", 2, "", "why", []byte(nil), "artifacts/a b.txt", int64(12))
	f.Add(int64(9), int64(-5), "intent", "", "ticket:42", "line\nbreak\x00", 1, "\"quoted\"", "<html>&", []byte(`{"a":[1,2,{"b":null}]}`), "", int64(-1))
	f.Add(int64(3), int64(1), "confirm", "", "k\xff", "", 0, "", "", []byte(`"s"`), "", int64(0))
	f.Add(int64(4), int64(2), "begin", "\u2028stage", "", "", 1, "", "", []byte(`  { "x" : 1 }  `), "é/ü", int64(3))
	f.Fuzz(func(t *testing.T, seq, nanos int64, ev, stage, key, errText string, attempt int, note, reason string, data []byte, outPath string, size int64) {
		if seq <= 0 || ev == "" {
			return // parseRecord refuses these: not records the writer makes
		}
		for _, s := range []string{stage, key} {
			if !utf8.ValidString(s) && s != "" {
				// The API never lets such a name into the ledger.
				assert.Error(t, checkKey(s), "checkKey(%q)", s)
				assert.Error(t, checkName(s), "checkName(%q)", s)
				return
			}
		}
		for _, s := range []string{ev, errText, note, reason, outPath} {
			if !utf8.ValidString(s) {
				return // free text: JSON replaces bad bytes, by design
			}
		}
		rec := &Record{Seq: seq, At: time.Unix(0, nanos).UTC(), Ev: ev, Session: "01890a5d-ac96-774b-bcce-b30209900001",
			Stage: stage, Attempt: attempt, Key: key, Error: errText, Note: note, Reason: reason, Prev: strings.Repeat("ab", 32)}
		if outPath != "" {
			rec.Outputs = []Output{{Path: outPath, SHA256: strings.Repeat("0", 64), Size: size}}
			rec.Inputs = map[string]string{outPath: "sha256:" + strings.Repeat("1", 64)}
		}
		if len(data) > 0 {
			if !json.Valid(data) {
				return // Data is JSON by construction: a receipt or request marshalled by the API
			}
			rec.Data = data
		}
		var buf bytes.Buffer
		require.NoError(t, appendRecord(&buf, rec))
		line := buf.Bytes()
		require.Equal(t, byte('\n'), line[len(line)-1], "one line, ending in a newline")
		require.Equal(t, 1, bytes.Count(line, []byte("\n")), "no newline inside a record")
		var d decoder
		got := &Record{}
		require.NoError(t, d.parse(line[:len(line)-1], rec.Prev, got))
		want := *rec
		if len(data) > 0 {
			var c bytes.Buffer
			require.NoError(t, json.Compact(&c, data))
			want.Data = c.Bytes() // stored compact
		}
		assert.True(t, want.At.Equal(got.At), "at: %v, got %v", want.At, got.At)
		got.At = want.At
		assert.Equal(t, &want, got)

		// A chain of such records replays, each hash matching.
		var chainBuf bytes.Buffer
		prev := ""
		for i := int64(1); i <= 3; i++ {
			r := *rec
			r.Seq, r.Prev = i, prev
			if i == 1 {
				r.Ev, r.Data = evCreate, json.RawMessage(`{"id":"x","request":"r","format":1}`)
			}
			n := chainBuf.Len()
			require.NoError(t, appendRecord(&chainBuf, &r))
			prev = lineHash(chainBuf.Bytes()[n : chainBuf.Len()-1])
		}
		var c chain
		count := 0
		torn, err := replay(bytes.NewReader(chainBuf.Bytes()), "ledger", &c, func(*Record, []byte) error { count++; return nil })
		require.NoError(t, err)
		assert.Equal(t, int64(-1), torn)
		assert.Equal(t, 3, count)
		assert.Equal(t, prev, c.hash)
		assert.Equal(t, int64(chainBuf.Len()), c.offset)
	})
}

// An effect key is what a later session looks the effect up by: one that
// the ledger cannot hold byte for byte (invalid UTF-8) would not be found
// after a resume, and the effect would be sent again.
func TestEffectKeyMustBeValidUTF8(t *testing.T) {
	ctx := context.Background()
	r, err := Open(t.TempDir(), &Options{Request: "keys", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	calls := 0
	_, err = r.Effect(ctx, "ticket:\xff", Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		calls++
		return nil, nil
	}})
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Zero(t, calls)
}

// The same holds for every name the ledger records and a later session
// looks up: an output path or an input name that is not valid UTF-8 would
// come back altered after a resume, and the completed stage would be
// redone every time. The API refuses them.
func TestRecordedNamesMustBeValidUTF8(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "names", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	err = r.Do(ctx, "out", func(_ context.Context, st *Stage) error {
		return st.WriteFile("artifacts/\xff.txt", []byte("x"))
	})
	assert.ErrorIs(t, err, ErrInvalid, "an output path")
	err = r.Do(ctx, "declared", func(_ context.Context, st *Stage) error {
		return st.Output("artifacts/\xfe.txt")
	})
	assert.ErrorIs(t, err, ErrInvalid, "a declared output path")
	_, err = r.Begin(ctx, "value", Value("model\xff", "x"))
	assert.ErrorIs(t, err, ErrInvalid, "a Value name")
	_, err = r.Begin(ctx, "file", File("input\xff.txt"))
	assert.ErrorIs(t, err, ErrInvalid, "a File path")

	// Valid names round-trip: the stage is not redone after a resume.
	require.NoError(t, r.Do(ctx, "ok", func(_ context.Context, st *Stage) error {
		return st.WriteFile("artifacts/é ü.txt", []byte("x"))
	}, Value("modèle", 1)))
	require.NoError(t, r.Close())
	r, err = Open(dir, &Options{Request: "names", NoSync: true})
	require.NoError(t, err)
	_, err = r.Begin(ctx, "ok", Value("modèle", 1))
	assert.ErrorIs(t, err, ErrDone)
}

// FuzzReplay is the ledger reader without the file system, fast enough for
// the short fuzz run in CI (.ci/run): on any bytes, replay never panics and
// either accepts a prefix of whole lines, each continuing the chain, with
// at most a torn last line after it, or stops with an error that names the
// file, the next line and the byte offset where the good prefix ends.
// FuzzLedger (fuzz_test.go) drives the same through Open, Inspect and Verify.
func FuzzReplay(f *testing.F) {
	for _, name := range []string{"basic.jsonl", "torn.jsonl", "foreign.jsonl", "format2.jsonl"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		f.Add(data)
		if i := bytes.IndexByte(data, '\n'); i > 0 {
			f.Add(data[:len(data)-i/2])                                                 // torn
			f.Add(append(append(bytes.Clone(data[:i+1]), "{bad}\n"...), data[i+1:]...)) // bad middle
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c chain
		n := 0
		torn, err := replay(bytes.NewReader(data), "logs/ledger.jsonl", &c, func(rec *Record, line []byte) error {
			n++
			require.Equal(t, int64(n), rec.Seq, "records come 1..n")
			return nil
		})
		require.Equal(t, int64(n), c.seq)
		require.LessOrEqual(t, c.offset, int64(len(data)))
		if c.offset > 0 {
			require.Equal(t, byte('\n'), data[c.offset-1], "the accepted prefix ends with a whole line")
		}
		var ce *CorruptError
		switch {
		case err == nil:
			if torn >= 0 {
				require.Equal(t, c.offset, torn, "a torn tail starts where the good prefix ends")
			} else {
				require.Equal(t, int64(len(data)), c.offset, "no torn tail: every byte was accepted")
			}
		case errors.As(err, &ce):
			require.Equal(t, "logs/ledger.jsonl", ce.Path)
			require.Equal(t, n+1, ce.Line, "the error names the first line not accepted")
			require.Equal(t, c.offset, ce.Offset, "at the byte where the good prefix ends")
			require.True(t, errors.Is(err, ErrCorrupt))
		default:
			require.ErrorIs(t, err, ErrVersion, "any other error is a version error: %v", err)
		}
	})
}
