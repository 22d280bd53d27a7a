package runstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeSeeds are ledger lines the fast path reads and lines it must leave
// to encoding/json, or that encoding/json rejects.
var decodeSeeds = []string{
	`{"seq":1,"at":"2026-11-29T07:29:11.627722373Z","ev":"create","session":"01a22635-37ca-7c81-9b46-72445a7b78fb","data":{"id":"x","request":"r","format":1},"prev":""}`,
	`{"seq":4,"at":"2026-11-29T07:28:48.494012504Z","ev":"begin","session":"s","stage":"a","attempt":1,"inputs":{"src/a.go":"sha256:00","after:b":"sha256:11"},"prev":"8f2f"}`,
	`{"seq":5,"at":"2026-11-29T07:28:48.495922659Z","ev":"complete","session":"s","stage":"a","attempt":1,"outputs":[{"path":"artifacts/a.txt","sha256":"2cf2","size":5},{"path":"b","sha256":"c","size":0}],"prev":"aaee"}`,
	`{"seq":8,"at":"2026-11-29T07:28:48Z","ev":"invalidate","session":"s","stage":"a","reason":"output artifacts/a.txt altered (sha256:d67e2e944994)","prev":"a7ec"}`,
	`{"seq":9,"at":"2026-11-29T07:28:48.5Z","ev":"intent","key":"ticket:1","data":{"title":"x"},"reason":"sha256:00","prev":"p"}`,
	`{"seq":10,"at":"2026-11-29T07:28:48.5Z","ev":"confirm","key":"k","data":null,"note":"confirmed by Check","by":"ann","prev":"p"}`,
	`{"seq":11,"at":"2026-11-29T07:28:48.5Z","ev":"fail","stage":"s","class":"retryable","error":"boom","prev":"p"}`,
	`{"seq":12,"at":"2026-11-29T07:28:48.5Z","ev":"plan","data":["a","b"],"prev":"p"}`,
	`{"seq":13,"at":"2026-11-29T07:28:48.5Z","ev":"close","data":{},"prev":"p"}`,
	`{"seq":14,"at":"2026-11-29T07:28:48.5Z","ev":"confirm","data":"a string","prev":"p"}`,
	`{"seq":15,"at":"2026-11-29T07:28:48.5Z","ev":"confirm","data":12.5e3,"prev":"p"}`,
	`{"seq":16,"at":"2026-11-29T07:28:48.5Z","ev":"confirm","data":[1,{"a":[true,false,null]}],"prev":"p"}`,
	`{"seq":17,"at":"2026-11-29T07:28:48.5Z","ev":"confirm","data":{"q":"a \"quoted\" }] string"},"prev":"p"}`,
	` { "seq" : 1 , "at" : "2026-11-29T07:28:48Z" , "ev" : "create" , "inputs" : { } , "outputs" : [ ] , "prev" : "" } `,
	`{"seq":2,"ev":"x","inputs":{"a":"1","a":"2"},"prev":""}`,
	`{"prev":"abc","ev":"begin","seq":3}`,
	`{"seq":1,"ev":"x","error":"line one\nline two","prev":""}`,
	`{"seq":1,"ev":"x","error":"caf\u00e9","prev":""}`,
	`{"seq":1,"ev":"x","error":"café ☕","prev":""}`,
	"{\"seq\":1,\"ev\":\"x\",\"error\":\"bad \xff utf8\",\"prev\":\"\"}",
	"{\"seq\":1,\"ev\":\"x\",\"error\":\"tab\there\",\"prev\":\"\"}",
	`{"seq":1,"ev":"x","future":{"a":1},"prev":""}`,
	`{"SEQ":1,"Ev":"x","prev":""}`,
	`{"seq":1,"seq":2,"ev":"x","prev":""}`,
	`{"seq":-1,"ev":"x","prev":""}`,
	`{"seq":01,"ev":"x","prev":""}`,
	`{"seq":1.0,"ev":"x","prev":""}`,
	`{"seq":1e2,"ev":"x","prev":""}`,
	`{"seq":99999999999999999999,"ev":"x","prev":""}`,
	`{"seq":9223372036854775807,"ev":"x","prev":""}`,
	`{"seq":null,"ev":"x","prev":""}`,
	`{"seq":"1","ev":"x","prev":""}`,
	`{"seq":1,"attempt":4294967296,"ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-02-30T00:00:00Z","ev":"x","prev":""}`,
	`{"seq":1,"at":"2024-02-29T23:59:59.999999999Z","ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-11-29T24:00:00Z","ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-11-29T07:28:60Z","ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-11-29T07:28:48.1234567891Z","ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-11-29T07:28:48,5Z","ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-11-29T07:28:48.Z","ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-11-29T07:28:48+02:00","ev":"x","prev":""}`,
	`{"seq":1,"at":"2026-11-29t07:28:48z","ev":"x","prev":""}`,
	`{"seq":1,"at":"0000-01-01T00:00:00Z","ev":"x","prev":""}`,
	`{"seq":1,"outputs":[{"path":"a","size":-1}],"ev":"x","prev":""}`,
	`{"seq":1,"outputs":[{"path":"a","extra":1}],"ev":"x","prev":""}`,
	`{"seq":1,"outputs":[{}],"ev":"x","prev":""}`,
	`{"seq":1,"outputs":null,"ev":"x","prev":""}`,
	`{"seq":1,"inputs":{"a":null},"ev":"x","prev":""}`,
	`{"seq":1,"ev":"x","prev":""}trailing`,
	`{"seq":1,"ev":"x","prev":""`,
	`{"seq":1,"ev":"x",}`,
	`{"seq":1,"ev":"x" "prev":""}`,
	`{"seq":1,"ev":"x","data":{"a":1,},"prev":""}`,
	`{"seq":1,"ev":"x","data":{"a" 1},"prev":""}`,
	`{"seq":1,"ev":"x","data":tru,"prev":""}`,
	`{"seq":1,"ev":"x","data":}`,
	`{}`,
	`[]`,
	`null`,
	``,
	`{"seq":1,"ev":"x","prev":"\u0041"}`,
	`{"seq":3,"at":"2026-12-01T11:58:05.637864906Z","ev":"plan","session":"s","data":["a","b"],"prev":"a1fd","crc":"beed9899"}`,
	`{"seq":3,"ev":"plan","prev":"a1fd","crc":"beed9899","x":1}`,
	`{"seq":3,"ev":"plan","prev":"a1fd","crc":"beed989"}`,
	`{"seq":3,"ev":"plan","prev":"a1fd","crc":12345678}`,
	`{"seq":3,"ev":"plan","prev":"a1fd","crc":"beed9899","crc":"beed9899"}`,
	`{"seq":3,"ev":"plan","CRC":"beed9899","prev":"a1fd"}`,
	`{"seq":3,"ev":"fail","EV":"complete","prev":"a1fd"}`,
	`{"seq":3,"ev":"fail","\u0065v":"complete","prev":"a1fd"}`,
	"{\"seq\":3,\"ev\":\"intent\",\"\u212aey\":\"k\",\"prev\":\"\"}",
	`{"seq":3,"ev":"x","outputs":[{"path":"a","PATH":"b","sha256":"","size":0}],"prev":""}`,
	`{"seq":3,"ev":"x","data":{"a":1,"a":2},"prev":""}`,
	`{"seq":3,"ev":"x","data":{"a":1,"A":2},"prev":""}`,
	`{"seq":3,"ev":"x","data":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]],"prev":""}`,
}

// FuzzDecodeFast checks the fast path against encoding/json: whenever it
// reads a line, encoding/json reads the same record from it; and parse,
// whichever way it goes, never panics.
func FuzzDecodeFast(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	if data, err := os.ReadFile(filepath.Join("testdata", "basic.jsonl")); err == nil {
		for _, line := range bytes.Split(data, []byte("\n")) {
			f.Add(line)
		}
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var d decoder
		var fast Record
		ok := d.decodeFast(line, "", &fast)
		var want Record
		jerr := json.Unmarshal(line, &want)
		if ok {
			require.NoError(t, jerr, "the fast path read %q, encoding/json rejects it", line)
			assert.Equal(t, want, fast, "%q", line)
			assert.True(t, want.At.Equal(fast.At) && want.At.Location() == fast.At.Location(), "%q", line)
		}
		var got Record
		perr := d.parse(line, "", &got)
		var slow *Record
		if jerr == nil {
			slow = &want
		}
		if perr == nil {
			require.NotNil(t, slow, "parse read %q, encoding/json rejects it", line)
			assert.Equal(t, *slow, got)
			// The line means one thing: what a reader that matches keys
			// exactly (jq) finds is what parse read.
			var exact map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(line, &exact))
			for k, v := range map[string]string{"ev": got.Ev, "stage": got.Stage, "key": got.Key, "prev": got.Prev, "error": got.Error, "session": got.Session} {
				var s string
				if raw, ok := exact[k]; ok && json.Unmarshal(raw, &s) == nil {
					assert.Equal(t, s, v, "%s in %q", k, line)
				} else {
					assert.Empty(t, v, "%s in %q: no such key, or not a string", k, line)
				}
			}
		}
	})
}

// TestDecodeFastReadsWriterOutput checks that the fast path is taken for
// every line this package writes in a run that uses every kind of record
// (but for text with characters JSON escapes, left to encoding/json).
func TestDecodeFastReadsWriterOutput(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "every record", Revision: "abc", Environment: map[string]string{"env": "test"}, MaxAttempts: 1})
	require.NoError(t, err)
	require.NoError(t, r.Plan(ctx, "a", "b", "c", "d"))
	in := filepath.Join(dir, "input.txt")
	require.NoError(t, os.WriteFile(in, []byte("x"), 0o644))
	require.NoError(t, r.Do(ctx, "a", func(ctx context.Context, st *Stage) error {
		return st.WriteFile("artifacts/a.txt", []byte("a"))
	}, File(in), Value("model", "m1")))
	require.NoError(t, r.Do(ctx, "b", func(ctx context.Context, st *Stage) error { return nil }, After("a")))
	require.Error(t, r.Do(ctx, "c", func(ctx context.Context, st *Stage) error { return errors.New("boom") }))
	require.NoError(t, r.Approve(ctx, "c", "ann", "ok"))
	require.NoError(t, r.Skip(ctx, "d", "not needed"))
	require.NoError(t, r.Invalidate(ctx, "a", "redo"))
	_, err = r.Effect(ctx, "ticket", Effect{Request: map[string]int{"n": 1}, Do: func(context.Context, string) (json.RawMessage, error) {
		return json.RawMessage(`{"id": 7}`), nil
	}})
	require.NoError(t, err)
	_, err = r.Effect(ctx, "mail", Effect{Do: func(context.Context, string) (json.RawMessage, error) { return nil, errors.New("timeout") }})
	require.ErrorIs(t, err, ErrUnconfirmed)
	require.NoError(t, r.Resolve(ctx, "mail", Resolution{Sent: true, Receipt: json.RawMessage(`"ok"`), By: "ann"}))
	require.NoError(t, r.Close())

	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(ledgerFile)))
	require.NoError(t, err)
	evs := map[string]bool{}
	for _, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		var d decoder
		var rec Record
		assert.True(t, d.decodeFast(line, "", &rec), "the fast path does not read %s", line)
		evs[rec.Ev] = true
	}
	for _, ev := range []string{evCreate, evOpen, evPlan, evBegin, evComplete, evFail, evAwait, evApprove, evSkip, evInvalidate, evIntent, evConfirm, evUnconfirmed, evClose} {
		assert.True(t, evs[ev], "no %s record in the test run", ev)
	}
}

// TestReplayAsyncSameAsSync replays ledgers, good and damaged, with the
// hashing goroutine and without: the same records, the same end, the same
// error.
func TestReplayAsyncSameAsSync(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, genRun(dir, 8000, false)) // about 3 MiB: above asyncMin
	good, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(ledgerFile)))
	require.NoError(t, err)
	require.Greater(t, len(good), asyncMin)
	lineAt := func(n int) int { // offset of line n (1-based)
		off := 0
		for i := 1; i < n; i++ {
			off += bytes.IndexByte(good[off:], '\n') + 1
		}
		return off
	}
	mid := lineAt(5000)
	cases := map[string][]byte{
		"good":             good,
		"torn, no newline": append(clone(good), `{"seq":8001,"at":"2026`...),
		"bad last line":    append(clone(good), "not json\n"...),
		"bad line inside":  append(append(clone(good[:mid]), "not json\n"...), good[mid:]...),
		"edited":           bytes.Replace(clone(good), []byte(`"size":142`), []byte(`"size":143`), 1),
		"line removed":     append(clone(good[:mid]), good[lineAt(5001):]...),
		"empty":            nil,
	}
	defer func() { asyncLinesOK = true }()
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			run := func(async bool) (recs []Record, c chain, torn int64, err error) {
				asyncLinesOK = async
				torn, err = replay(io.NewSectionReader(bytes.NewReader(data), 0, int64(len(data))), "ledger", &c, func(rec *Record, _ []byte) error {
					recs = append(recs, *rec)
					return nil
				})
				return
			}
			r1, c1, t1, e1 := run(false)
			r2, c2, t2, e2 := run(true)
			assert.Equal(t, len(r1), len(r2))
			assert.Equal(t, r1, r2)
			assert.Equal(t, c1, c2)
			assert.Equal(t, t1, t2)
			assert.Equal(t, e1, e2)
			if name == "good" {
				assert.NoError(t, e2)
				assert.Equal(t, int64(8000), c2.seq)
			}
			if strings.HasPrefix(name, "bad line") || name == "edited" || name == "line removed" {
				var ce *CorruptError
				assert.ErrorAs(t, e2, &ce)
			}
		})
	}
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }
