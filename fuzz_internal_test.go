package runstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
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
	f.Add(int64(5), int64(0), "begin", "s", "", "", -1, "", "", []byte(nil), "", int64(0))       // a negative attempt
	f.Add(int64(6), int64(0), "complete", "s", "", "", 1, "", "", []byte(nil), "out", int64(-1)) // a negative size
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
		if attempt < 0 || attempt > maxAttempt || (outPath != "" && size < 0) {
			// Not a record the writer makes (Begin counts attempts 1 to
			// maxAttempt, an output's size is its file's length): the
			// reader refuses it as corruption.
			assert.Error(t, d.parse(line[:len(line)-1], rec.Prev, got), "attempt %d, size %d", attempt, size)
			return
		}
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
	for _, name := range []string{"basic.jsonl", "torn.jsonl", "foreign.jsonl", "format2.jsonl", "crc.jsonl"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(f, err)
		f.Add(data)
		if i := bytes.IndexByte(data, '\n'); i > 0 {
			f.Add(data[:len(data)-i/2])                                                 // torn
			f.Add(append(append(bytes.Clone(data[:i+1]), "{bad}\n"...), data[i+1:]...)) // bad middle
			f.Add(append(bytes.Clone(data), "{bad}\n"...))                              // bad last line, whole
		}
		if len(data) > 20 { // a flipped bit in the last line
			flipped := bytes.Clone(data)
			flipped[len(data)-20] ^= 1
			f.Add(flipped)
		}
		// The last line with a key again, in another case, escaped.
		for _, k := range []string{`"ev":"x",`, `"EV":"x",`, `"\u0065v":"x",`, `"crc":"00000000",`} {
			if i := bytes.LastIndex(data[:max(len(data)-1, 0)], []byte("\n{")); i > 0 {
				f.Add(append(append(bytes.Clone(data[:i+2]), k...), data[i+2:]...))
			}
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

// encodeWhole is manifest.json's encoding as encoding/json gives it for the
// whole struct at once, but for the effects' requests and receipts, which
// are compact (json.Compact) where encoding/json indents them: what
// manifest.encode must equal, byte for byte.
func encodeWhole(m *manifest) ([]byte, error) {
	c := *m
	var raws [][]byte // in place of each, a string that no other value is
	mark := func(i int) string { return fmt.Sprintf(`"\u0000runstate-raw-%d\u0000"`, i) }
	if m.Effects != nil {
		c.Effects = make([]*EffectStatus, len(m.Effects))
		for i, e := range m.Effects {
			if e == nil {
				continue
			}
			ce := *e
			for _, f := range []*json.RawMessage{&ce.Request, &ce.Receipt} {
				if len(*f) == 0 {
					continue
				}
				var b bytes.Buffer
				if err := json.Compact(&b, *f); err != nil {
					return nil, err
				}
				*f = json.RawMessage(mark(len(raws)))
				raws = append(raws, b.Bytes())
			}
			c.Effects[i] = &ce
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&c); err != nil {
		return nil, err
	}
	out := buf.Bytes()
	for i, r := range raws {
		out = bytes.Replace(out, []byte(mark(i)), r, 1)
	}
	return out, nil
}

// manifestOf builds a state whose stages (complete with inputs and
// outputs, awaiting a person, awaiting a review) and effect are made of
// the given strings, and snapshots it.
func manifestOf(name, reason, errText, path, inKey, inVal, key string, request []byte, stages int, at int64) *manifest {
	s := newState()
	s.identity = runIdentity{ID: "m", Request: reason, Format: FormatVersion, Environment: map[string]string{inKey: inVal}}
	seq := int64(0)
	add := func(r *Record) {
		seq++
		r.Seq, r.At = seq, time.Unix(at, seq).UTC()
		s.apply(r)
	}
	names := []string{name}
	for i := 1; i < stages; i++ {
		names = append(names, name+strconv.Itoa(i))
	}
	data, _ := json.Marshal(names)
	add(&Record{Ev: evPlan, Data: data})
	for i, n := range names {
		add(&Record{Ev: evBegin, Stage: n, Attempt: 1 + i, Session: reason, Inputs: map[string]string{inKey: inVal, "value:x": errText}})
		switch i % 4 {
		case 0:
			add(&Record{Ev: evComplete, Stage: n, Inputs: map[string]string{inKey: inVal, "file:" + path: reason}, Outputs: []Output{{Path: path, SHA256: inVal, Size: int64(len(path))}, {Path: path + "/2", SHA256: inKey}}})
		case 1:
			add(&Record{Ev: evFail, Stage: n, Class: ClassPerson, Error: errText})
		case 2:
			add(&Record{Ev: evAwait, Stage: n, Reason: reason, Outputs: []Output{{Path: path}}})
		case 3:
			add(&Record{Ev: evFail, Stage: n, Class: ClassRetryable, Error: errText})
		}
	}
	add(&Record{Ev: evIntent, Key: key, Reason: inVal, Data: request})
	add(&Record{Ev: evOpen, Session: errText, Data: []byte(`{"pid":1,"host":"h"}`)})
	s.pos = chain{seq: seq, hash: strings.Repeat("0", 64), offset: 100}
	s.lastLen = 50
	return s.snapshot(time.Unix(at, 0))
}

// FuzzManifestEncode: manifest.encode, which writes the stages and
// artifacts by hand and splices them into encoding/json's encoding of the
// rest, equals encoding/json's encoding of the whole manifest, byte for
// byte, for any strings in it (HTML, U+2028, control characters, invalid
// UTF-8, map keys to escape), any number of stages, any times (a year
// outside 0-9999 is an error either way).
func FuzzManifestEncode(f *testing.F) {
	f.Add("plan", "why <b>&</b>", "boom\n\x00\b\f\x7f", "artifacts/a b.txt", "file:in", "sha256:00", "ticket:1", []byte(`{"to":"a@b"}`), 3, int64(1700000000))
	f.Add("\u2028stage\u2029", "\"quoted\" \\ \xff", "\xff\xfe", "é/ü\xc3", "", "", "", []byte(nil), 4, int64(0))
	f.Add("s", "", "", "", "k\"ey\u2029", "v", "key", []byte(`  [1, 2]  `), 5, int64(-62135596800))
	f.Add("y", "r", "e", "p", "k", "v", "key", []byte(nil), 1, int64(253402300800)) // the year 10000
	f.Fuzz(func(t *testing.T, name, reason, errText, path, inKey, inVal, key string, request []byte, stages int, at int64) {
		if len(request) > 0 && !json.Valid(request) {
			request = nil // a record's data is JSON: the reader refuses other bytes
		}
		m := manifestOf(name, reason, errText, path, inKey, inVal, key, request, min(max(stages, 0), 12), at)
		want, werr := encodeWhole(m)
		got, gerr := m.encode(0)
		if werr != nil || gerr != nil {
			require.Equal(t, werr != nil, gerr != nil, "whole: %v, by hand: %v", werr, gerr)
			return
		}
		require.Equal(t, string(want), string(got))
	})
}

// TestManifestEncode checks manifest.encode against encoding/json's
// encoding of the whole manifest for 0 to 300 stages, and that what
// encodeManifest writes passes decodeManifest's checksum.
func TestManifestEncode(t *testing.T) {
	for _, stages := range []int{0, 1, 2, 4, 300} {
		m := manifestOf("stage", "r", "e", "artifacts/x", "file:a", "sha256:b", "k", []byte(`{"a":1}`), stages, 1700000000)
		want, err := encodeWhole(m)
		require.NoError(t, err)
		for _, hint := range []int{0, len(want) / 2, len(want), 10 * len(want)} {
			got, err := m.encode(hint)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got), "%d stages, hint %d", stages, hint)
		}
	}
	empty := newState()
	empty.pos = chain{seq: 1, hash: strings.Repeat("0", 64), offset: 10}
	empty.lastLen = 10
	m := empty.snapshot(time.Unix(0, 0))
	want, err := encodeWhole(m)
	require.NoError(t, err)
	got, err := m.encode(0)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "no stages, no artifacts")

	// A stage time encoding/json refuses (a year past 9999), alone in the
	// manifest: the error comes from the hand-written part.
	far := &manifest{Format: FormatVersion, Stages: []*StageStatus{{Name: "s", State: StatePending, At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}}
	_, err = encodeWhole(far)
	require.Error(t, err)
	_, err = far.encode(0)
	require.Error(t, err, "a stage time encoding/json cannot write")

	s := newState()
	var names []string
	for i := range 300 {
		names = append(names, "s"+strconv.Itoa(i))
	}
	data, err := json.Marshal(names)
	require.NoError(t, err)
	s.apply(&Record{Seq: 1, Ev: evPlan, Data: data})
	for i, n := range names {
		s.apply(&Record{Seq: int64(i + 2), Ev: evComplete, Stage: n, Outputs: []Output{{Path: "artifacts/" + n, SHA256: "ab", Size: 1}}})
	}
	s.pos = chain{seq: 302, hash: strings.Repeat("0", 64), offset: 1000}
	s.lastLen = 100
	out, err := s.encodeManifest(time.Unix(0, 0))
	require.NoError(t, err)
	from, _, err := decodeManifest(out)
	require.NoError(t, err, "decodeManifest's checksum")
	require.Len(t, from.stages, 300)
	fast, ok := decodeManifestFast(out)
	require.True(t, ok, "a manifest this package writes takes the fast path")
	require.Len(t, fast.Stages, 300)
	require.Len(t, fast.Artifacts, 300)
	want, err = encodeWhole(s.snapshot(time.Unix(0, 0)))
	require.NoError(t, err)
	i := bytes.LastIndex(out, []byte(`"sum": "`))
	require.Equal(t, string(want[:i]), string(out[:i]), "all but the sum")
}

// TestManifestEncodeEveryField sets every field of a StageStatus, an
// Output and an Artifact, found by reflection, and checks the hand-written
// encoding against encoding/json's: a field added to those types and not
// to appendStage or appendArtifact fails here, where the fuzz target, which
// sets fields by name, would not notice (and a resume from the manifest
// would silently lose it).
func TestManifestEncodeEveryField(t *testing.T) {
	fill := func(v reflect.Value, path string) { fillEveryField(t, v, path) }
	var st StageStatus
	var a Artifact
	fill(reflect.ValueOf(&st).Elem(), "stage")
	fill(reflect.ValueOf(&a).Elem(), "artifact")
	m := &manifest{Format: FormatVersion, Stages: []*StageStatus{&st}, Artifacts: []Artifact{a}}
	want, err := encodeWhole(m)
	require.NoError(t, err)
	got, err := m.encode(0)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
}

// FuzzDecodeManifestFast: on any bytes, the manifest's fast path either
// gives up or decodes what encoding/json decodes (compared through their
// encodings); and on manifests this package writes, from the fuzzer's
// strings, it does not give up unless a string needs an escape.
func FuzzDecodeManifestFast(f *testing.F) {
	for _, stages := range []int{0, 1, 5} {
		m := manifestOf("stage", "why", "boom", "artifacts/a b.txt", "file:in", "sha256:00", "ticket:1", []byte(`{"to":"a@b"}`), stages, 1700000000)
		data, err := m.encode(0)
		require.NoError(f, err)
		f.Add(data)
		f.Add(bytes.Replace(data, []byte(`"attempts": 1`), []byte(`"attempts": 1.0`), 1))
		f.Add(bytes.Replace(data, []byte(`"stages": [`), []byte(`"stages": [null,`), 1))
		f.Add(append(bytes.Clone(data[:len(data)-2]), `,"stages":[]}`...))
		f.Add(append(bytes.Clone(data[:len(data)-2]), `,"Artifacts":[]}`...))
		f.Add(append(bytes.Clone(data[:len(data)-2]), `,"st\u0061ges":[]}`...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ok := decodeManifestFast(data)
		var slow manifest
		serr := json.Unmarshal(data, &slow)
		if !ok {
			return
		}
		require.NoError(t, serr, "the fast path read what encoding/json refuses")
		a, aerr := encodeWhole(&fast)
		b, berr := encodeWhole(&slow)
		require.Equal(t, berr == nil, aerr == nil)
		require.Equal(t, string(b), string(a), "the fast path read something else")
	})
}

// fillEveryField sets every field of v (reflect.ValueOf(&x).Elem()),
// recursively, to a value that is not zero and names its path: strings
// with characters to escape, two elements in a slice, one entry in a map,
// a time in 2023. It fails t on a kind it does not know, so that a field
// added to a type that a test encodes by hand cannot go unnoticed.
func fillEveryField(t *testing.T, v reflect.Value, path string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(path + " <&>\u2028")
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(len(path)))
	case reflect.Uint8:
		v.SetUint(uint64(len(path)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fillEveryField(t, k, path+".key")
		fillEveryField(t, e, path+".value")
		v.SetMapIndex(k, e)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fillEveryField(t, v.Index(0), path+"[0]")
		fillEveryField(t, v.Index(1), path+"[1]")
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Unix(1700000000, int64(len(path))).UTC()))
			return
		}
		for i := range v.NumField() {
			fillEveryField(t, v.Field(i), path+"."+v.Type().Field(i).Name)
		}
	default:
		t.Fatalf("%s: a %s: teach this test (and the encoder it checks) that kind", path, v.Kind())
	}
}
