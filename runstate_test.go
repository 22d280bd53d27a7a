package runstate_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// Helpers shared by the black-box tests (runstate_test.go, recovery_test.go,
// concurrency_test.go, badinput_test.go, crash_unix_test.go).

const testRequest = "test: add tests for the billing parser"

// testOptions are the options most tests open runs with: NoSync keeps
// them fast; durability is what the crash tests check.
func testOptions() *runstate.Options {
	return &runstate.Options{Request: testRequest, Revision: "rev-1", NoSync: true}
}

// newTestRun opens a new run in a fresh directory; it is closed when the
// test ends.
func newTestRun(t testing.TB) (*runstate.Run, string) {
	t.Helper()
	dir := t.TempDir()
	return openRun(t, dir, testOptions()), dir
}

// openRun opens dir and closes the run when the test ends.
func openRun(t testing.TB, dir string, opts *runstate.Options) *runstate.Run {
	t.Helper()
	r, err := runstate.Open(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func ledgerPath(dir string) string { return filepath.Join(dir, "logs", "ledger.jsonl") }

func readLedgerBytes(t testing.TB, dir string) []byte {
	t.Helper()
	data, err := os.ReadFile(ledgerPath(dir))
	require.NoError(t, err)
	return data
}

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// ledgerLine is one line of a ledger as the tests see it.
type ledgerLine struct {
	raw    []byte // without '\n'
	offset int64  // where the line starts
	rec    runstate.Record
	keys   []string // top-level field names in order
}

// parseLedger splits a ledger into lines. Every line must end with '\n' and
// parse as a record.
func parseLedger(t testing.TB, data []byte) []ledgerLine {
	t.Helper()
	var out []ledgerLine
	var off int64
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		require.GreaterOrEqual(t, i, 0, "ledger line at byte %d has no newline", off)
		raw := data[:i]
		var l ledgerLine
		l.raw, l.offset = raw, off
		require.NoError(t, json.Unmarshal(raw, &l.rec), "line at byte %d: %s", off, raw)
		l.keys = topKeys(t, raw)
		out = append(out, l)
		off += int64(i + 1)
		data = data[i+1:]
	}
	return out
}

// topKeys returns the top-level keys of a JSON object in order.
func topKeys(t testing.TB, obj []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	tok, err := dec.Token()
	require.NoError(t, err)
	require.Equal(t, json.Delim('{'), tok)
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		require.NoError(t, err)
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		require.NoError(t, dec.Decode(&skip))
	}
	return keys
}

// checkLedger reads the ledger in dir and checks it is exactly as the
// package doc (doc.go) says a writer leaves it: every line '\n'-terminated and a record, seq
// 1, 2, 3 … without gaps, prev the hash of the line before, and the fields
// seq, at, ev first and prev, then crc (the line's checksum), last.
// assertVerifies checks the whole run with Verify: no problem at all.
func assertVerifies(t testing.TB, dir string) {
	t.Helper()
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

func checkLedger(t testing.TB, dir string) []ledgerLine {
	t.Helper()
	lines := parseLedger(t, readLedgerBytes(t, dir))
	require.NotEmpty(t, lines)
	prev := ""
	crc := false // a line had a crc: every later one must (lines before it may be a fixture's, written without)
	for i, l := range lines {
		require.Equal(t, int64(i+1), l.rec.Seq, "line %d: seq", i+1)
		require.Equal(t, prev, l.rec.Prev, "line %d: prev", i+1)
		require.GreaterOrEqual(t, len(l.keys), 4, "line %d", i+1)
		require.Equal(t, []string{"seq", "at", "ev"}, l.keys[:3], "line %d: field order", i+1)
		prev = sha256Hex(l.raw)
		if !crc && l.keys[len(l.keys)-1] == "prev" {
			continue
		}
		crc = true
		require.Equal(t, []string{"prev", "crc"}, l.keys[len(l.keys)-2:], "line %d: prev, then crc, must be last", i+1)
		n := len(l.raw) - len(`,"crc":"00000000"}`)
		require.Equal(t, fmt.Sprintf(`,"crc":"%08x"}`, crc32.Checksum(l.raw[:n], crc32.MakeTable(crc32.Castagnoli))), string(l.raw[n:]),
			"line %d: crc is the CRC-32C of the line before it", i+1)
	}
	require.True(t, crc, "the writer puts a crc on every line")
	require.Equal(t, "create", lines[0].rec.Ev)
	return lines
}

// events returns the records of lines with the given ev (and stage, when
// not empty).
func events(lines []ledgerLine, ev, stage string) []runstate.Record {
	var out []runstate.Record
	for _, l := range lines {
		if l.rec.Ev == ev && (stage == "" || l.rec.Stage == stage) {
			out = append(out, l.rec)
		}
	}
	return out
}

func lastRecord(t testing.TB, dir string) runstate.Record {
	t.Helper()
	lines := parseLedger(t, readLedgerBytes(t, dir))
	require.NotEmpty(t, lines)
	return lines[len(lines)-1].rec
}

// nextStepsSeq returns the seq the first line of logs/next-steps.txt names.
func nextStepsSeq(t testing.TB, dir string) (int64, string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(data), "\n")
	_, after, ok := strings.Cut(first, "as of ledger seq ")
	require.True(t, ok, "first line names no seq: %q", first)
	num, _, _ := strings.Cut(after, " ")
	seq, err := strconv.ParseInt(num, 10, 64)
	require.NoError(t, err, "first line: %q", first)
	return seq, string(data)
}

// manifestView is the part of manifest.json the tests read.
type manifestView struct {
	Format  int    `json:"format"`
	ID      string `json:"id"`
	Request string `json:"request"`
	Seq     int64  `json:"seq"`
	Ledger  struct {
		Offset int64  `json:"offset"`
		End    int64  `json:"end"`
		Hash   string `json:"hash"`
	} `json:"ledger"`
	Plan   []string `json:"plan"`
	Stages []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"stages"`
}

func readManifest(t testing.TB, dir string) manifestView {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	var m manifestView
	require.NoError(t, json.Unmarshal(data, &m), "manifest.json: %s", data)
	return m
}

// writeStage is a Do body that writes one artifact.
func writeStage(path, content string) func(context.Context, *runstate.Stage) error {
	return func(_ context.Context, st *runstate.Stage) error {
		return st.WriteFile(path, []byte(content))
	}
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
	require.NoError(t, os.WriteFile(to, data, 0o644))
}

// --- Open, identity, Close ---------------------------------------------

func TestOpenCreatesRun(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"env": "staging", "region": "eu"}
	r, err := runstate.Open(dir, &runstate.Options{Request: testRequest, Revision: "3f2a1c9", Environment: env})
	require.NoError(t, err)
	require.NoError(t, r.Close())

	lines := checkLedger(t, dir)
	require.Len(t, lines, 3)
	assert.Equal(t, []string{"create", "open", "close"}, []string{lines[0].rec.Ev, lines[1].rec.Ev, lines[2].rec.Ev})

	create := lines[0].rec
	assert.Equal(t, int64(1), create.Seq)
	assert.Equal(t, "", create.Prev)
	var id struct {
		ID          string            `json:"id"`
		Request     string            `json:"request"`
		Revision    string            `json:"revision"`
		Environment map[string]string `json:"environment"`
		Format      int               `json:"format"`
	}
	require.NoError(t, json.Unmarshal(create.Data, &id))
	u, err := uuid.Parse(id.ID)
	require.NoError(t, err, "run id %q", id.ID)
	assert.Equal(t, uuid.Version(7), u.Version(), "run id must be a UUIDv7")
	assert.Equal(t, testRequest, id.Request)
	assert.Equal(t, "3f2a1c9", id.Revision)
	assert.Equal(t, env, id.Environment)
	assert.Equal(t, 1, id.Format)
	assert.Equal(t, id.ID, r.ID())

	open := lines[1].rec
	var od struct {
		PID  int    `json:"pid"`
		Host string `json:"host"`
	}
	require.NoError(t, json.Unmarshal(open.Data, &od))
	host, _ := os.Hostname()
	assert.Equal(t, os.Getpid(), od.PID)
	assert.Equal(t, host, od.Host)
	su, err := uuid.Parse(open.Session)
	require.NoError(t, err, "session %q", open.Session)
	assert.Equal(t, r.Session(), open.Session)
	assert.Equal(t, uuid.Version(7), su.Version())
	assert.Equal(t, open.Session, lines[2].rec.Session, "close names the session")

	for _, l := range lines {
		var raw struct {
			At string `json:"at"`
		}
		require.NoError(t, json.Unmarshal(l.raw, &raw))
		at, err := time.Parse(time.RFC3339Nano, raw.At)
		require.NoError(t, err, "at %q", raw.At)
		assert.True(t, strings.HasSuffix(raw.At, "Z"), "at %q must be UTC", raw.At)
		assert.WithinDuration(t, time.Now(), at, time.Minute)
	}

	// The session's lock is gone after Close; the writers' lock stays.
	ents, err := os.ReadDir(filepath.Join(dir, "logs", "sessions"))
	require.NoError(t, err)
	assert.Empty(t, ents)
	assert.FileExists(t, filepath.Join(dir, "logs", "ledger.lock"))
}

func TestOpenResumesRun(t *testing.T) {
	dir := t.TempDir()
	r1 := openRun(t, dir, testOptions())
	id := r1.ID()
	require.NoError(t, r1.Close())

	r2 := openRun(t, dir, testOptions())
	assert.Equal(t, id, r2.ID())
	assert.NotEqual(t, r1.Session(), r2.Session())
	require.NoError(t, r2.Close())

	lines := checkLedger(t, dir)
	evs := []string{}
	for _, l := range lines {
		evs = append(evs, l.rec.Ev)
	}
	assert.Equal(t, []string{"create", "open", "close", "open", "close"}, evs)
	assert.Len(t, events(lines, "create", ""), 1)
	assert.Equal(t, r2.Session(), lines[3].rec.Session)

	// An empty Request resumes whatever the run serves (tools do that).
	r3 := openRun(t, dir, &runstate.Options{NoSync: true})
	st, err := r3.Status()
	require.NoError(t, err)
	assert.Equal(t, testRequest, st.Request)
	assert.Equal(t, 3, st.Metrics.Sessions)
	assert.Equal(t, 2, st.Metrics.ResumedSessions)
}

func TestOpenNewRunNeedsRequest(t *testing.T) {
	dir := t.TempDir()
	_, err := runstate.Open(dir, nil)
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "Request")
	data, _ := os.ReadFile(ledgerPath(dir))
	assert.Empty(t, data, "nothing may be recorded")
}

func TestOpenRequestMismatch(t *testing.T) {
	dir := t.TempDir()
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Close())
	before := readLedgerBytes(t, dir)

	_, err := runstate.Open(dir, &runstate.Options{Request: "something else entirely"})
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), testRequest, "names the run's request")
	assert.Contains(t, err.Error(), "something else entirely", "names the asked request")
	assert.Contains(t, err.Error(), dir, "names the directory")
	assert.Equal(t, before, readLedgerBytes(t, dir), "a refused Open writes nothing")
}

func TestOpenOtherRevisionIsRecorded(t *testing.T) {
	dir := t.TempDir()
	r := openRun(t, dir, &runstate.Options{Request: testRequest, Revision: "aaa", Environment: map[string]string{}, NoSync: true})
	require.NoError(t, r.Close())
	r = openRun(t, dir, &runstate.Options{Request: testRequest, Revision: "bbb", Environment: map[string]string{"env": "prod"}, NoSync: true})
	st, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, "bbb", st.Revision)
	assert.Equal(t, map[string]string{"env": "prod"}, st.Environment)
	require.NoError(t, r.Close())

	opens := events(checkLedger(t, dir), "open", "")
	require.Len(t, opens, 2)
	var d struct {
		Revision    string            `json:"revision"`
		Environment map[string]string `json:"environment"`
	}
	require.NoError(t, json.Unmarshal(opens[1].Data, &d))
	assert.Equal(t, "bbb", d.Revision)
	assert.Equal(t, map[string]string{"env": "prod"}, d.Environment)

	// A nil Environment equals an empty one: still the same run. A
	// session that names neither leaves the run's as they were.
	r = openRun(t, dir, &runstate.Options{Request: testRequest, NoSync: true})
	require.NoError(t, r.Close())
	st, err = runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, "bbb", st.Revision)
	assert.Equal(t, map[string]string{"env": "prod"}, st.Environment)
}

func TestOpenDoesNotWriteIntoOptions(t *testing.T) {
	env := map[string]string{"a": "1"}
	opts := &runstate.Options{Request: testRequest, Environment: env, NoSync: true}
	want := *opts
	r := openRun(t, t.TempDir(), opts)
	env["a"] = "2" // the run keeps its own copy
	st, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, "1", st.Environment["a"])
	assert.Equal(t, want.Request, opts.Request)
	assert.Zero(t, opts.MaxAttempts)
	assert.Zero(t, opts.ManifestInterval)
}

func TestCloseIsIdempotent(t *testing.T) {
	r, dir := newTestRun(t)
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	require.NoError(t, r.Close())
	lines := checkLedger(t, dir)
	assert.Len(t, events(lines, "close", ""), 1)
	assert.Equal(t, "close", lines[len(lines)-1].rec.Ev)
}

func TestCallsAfterClose(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Plan(ctx, "a"))
	st, err := r.Begin(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, r.Close())
	before := readLedgerBytes(t, dir)

	calls := map[string]func() error{
		"Plan":  func() error { return r.Plan(ctx, "a", "b") },
		"Begin": func() error { _, err := r.Begin(ctx, "b"); return err },
		"Do": func() error {
			return r.Do(ctx, "b", func(context.Context, *runstate.Stage) error { t.Error("fn called after Close"); return nil })
		},
		"Skip":       func() error { return r.Skip(ctx, "b", "no") },
		"Approve":    func() error { return r.Approve(ctx, "a", "me", "") },
		"Invalidate": func() error { return r.Invalidate(ctx, "a", "why") },
		"Refresh":    func() error { return r.Refresh(ctx) },
		"Status":     func() error { _, err := r.Status(); return err },
		"NextSteps":  func() error { _, err := r.NextSteps(); return err },
		"Effect": func() error {
			_, err := r.Effect(ctx, "k", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
				t.Error("effect sent after Close")
				return nil, nil
			}})
			return err
		},
		"Stage.Complete": st.Complete,
		"Stage.Fail":     func() error { return st.Fail(errors.New("x")) },
	}
	for name, call := range calls {
		assert.ErrorIs(t, call(), runstate.ErrClosed, name)
	}
	assert.Equal(t, before, readLedgerBytes(t, dir), "calls after Close write nothing")
}

// --- The ledger format ---------------------------------------------------

func TestLedgerFormat(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	require.NoError(t, r.Do(ctx, "a", writeStage("artifacts/a.txt", "A"), runstate.Value("model", "m-1")))
	require.Error(t, r.Do(ctx, "b", func(context.Context, *runstate.Stage) error { return errors.New("flaky") }))
	require.NoError(t, r.Do(ctx, "b", writeStage("artifacts/b.txt", "B"), runstate.After("a")))
	require.NoError(t, r.Skip(ctx, "c", "not needed"))
	require.NoError(t, r.Close())

	lines := checkLedger(t, dir)
	var evs []string
	for _, l := range lines {
		evs = append(evs, l.rec.Ev)
	}
	assert.Equal(t, []string{"create", "open", "plan", "begin", "complete", "begin", "fail", "begin", "complete", "skip", "close"}, evs)

	compA := events(lines, "complete", "a")[0]
	assert.Equal(t, 1, compA.Attempt)
	assert.Equal(t, []runstate.Output{{Path: "artifacts/a.txt", SHA256: sha256Hex([]byte("A")), Size: 1}}, compA.Outputs)
	assert.Contains(t, compA.Inputs, "model")
	assert.True(t, strings.HasPrefix(compA.Inputs["model"], "sha256:"), compA.Inputs["model"])
	fail := events(lines, "fail", "b")[0]
	assert.Equal(t, "retryable", fail.Class)
	assert.Equal(t, "flaky", fail.Error)
	assert.Equal(t, 2, events(lines, "complete", "b")[0].Attempt, "attempt counts every begin")
	assert.Contains(t, events(lines, "begin", "b")[1].Inputs, "after:a")
	assert.Equal(t, "not needed", events(lines, "skip", "c")[0].Reason)

	var plan []string
	require.NoError(t, json.Unmarshal(events(lines, "plan", "")[0].Data, &plan))
	assert.Equal(t, []string{"a", "b", "c"}, plan)

	// Fields that do not apply are omitted.
	assert.NotContains(t, string(lines[1].raw), `"stage"`)
	assert.NotContains(t, string(lines[1].raw), `"outputs"`)

	// ReadLedger sees the same records in the same order.
	var seqs []int64
	require.NoError(t, runstate.ReadLedger(dir, func(rec *runstate.Record) error {
		seqs = append(seqs, rec.Seq)
		return nil
	}))
	assert.Len(t, seqs, len(lines))
	for i, s := range seqs {
		assert.Equal(t, int64(i+1), s)
	}
}

// TestReadForeignLedger opens a ledger whose fields come in another order,
// with unknown fields, an unknown event and times with a UTC offset.
func TestReadForeignLedger(t *testing.T) {
	dir := t.TempDir()
	copyFile(t, "testdata/foreign.jsonl", ledgerPath(dir))
	before := readLedgerBytes(t, dir)

	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, "fixture: foreign writer", st.Request)
	assert.Equal(t, int64(7), st.Seq)
	assert.Equal(t, []string{"fetch", "build"}, st.Plan)
	fetch, ok := st.Stage("fetch")
	require.True(t, ok)
	assert.Equal(t, runstate.StateComplete, fetch.State)
	assert.Equal(t, "artifacts/fetch.txt", fetch.Outputs[0].Path)
	assert.True(t, fetch.DoneAt.Equal(time.Date(2025, 3, 1, 8, 0, 5, 123456789, time.UTC)), "done at %s", fetch.DoneAt)
	assert.Equal(t, "build", st.Next)

	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(7), rep.Records)
	for _, p := range rep.Problems {
		assert.NotContains(t, p.File, "ledger.jsonl", "the ledger itself is fine: %s", p)
	}

	// A writer resumes it and chains on.
	r := openRun(t, dir, &runstate.Options{Request: "fixture: foreign writer", NoSync: true})
	require.NoError(t, r.Close())
	after := readLedgerBytes(t, dir)
	require.True(t, bytes.HasPrefix(after, before), "the existing records are kept byte for byte")
	lines := parseLedger(t, after)
	require.Len(t, lines, 9)
	assert.Equal(t, sha256Hex(lines[6].raw), lines[7].rec.Prev)
	assert.Equal(t, int64(8), lines[7].rec.Seq)
	rep, err = runstate.Verify(dir)
	require.NoError(t, err)
	assert.Equal(t, int64(9), rep.Records)
}

// TestReadBasicFixture reads a ledger written by an earlier build of this
// version: a format change that breaks reading it must be a new version.
func TestReadBasicFixture(t *testing.T) {
	dir := t.TempDir()
	copyFile(t, "testdata/basic.jsonl", ledgerPath(dir))
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, "fixture: build the report", st.Request)
	assert.Equal(t, "def456", st.Revision)
	assert.Equal(t, 1, st.Format)
	assert.Equal(t, int64(13), st.Seq)
	assert.Equal(t, 3, st.Done)
	assert.Equal(t, 0, st.Remaining)
	build, _ := st.Stage("build")
	assert.Equal(t, runstate.StateComplete, build.State)
	assert.Equal(t, 2, build.Attempt)
	deploy, _ := st.Stage("deploy")
	assert.Equal(t, runstate.StateSkipped, deploy.State)
	assert.Equal(t, 2, st.Metrics.Sessions)
	assert.Equal(t, 1, st.Metrics.Failures)
	assert.Equal(t, 0, st.Metrics.DuplicatedWork)
	assert.Len(t, st.Artifacts, 2)

	r := openRun(t, dir, &runstate.Options{Request: "fixture: build the report", NoSync: true})
	assert.Equal(t, st.ID, r.ID())
	require.NoError(t, r.Close())
	checkLedger(t, dir)
}

// --- Stages ---------------------------------------------------------------

func TestPlan(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Plan(ctx, "a", "b"))
	n := len(readLedgerBytes(t, dir))
	require.NoError(t, r.Plan(ctx, "a", "b"))
	assert.Len(t, readLedgerBytes(t, dir), n, "the same plan again writes nothing")
	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	st, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c"}, st.Plan)
	assert.Equal(t, 3, st.Remaining)
	assert.Equal(t, "a", st.Next)
	assert.ErrorIs(t, r.Plan(ctx, "a", "a"), runstate.ErrInvalid)
	assert.Len(t, events(checkLedger(t, dir), "plan", ""), 2)
}

func TestBeginCompleteDone(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "build", runstate.Value("flags", []string{"-O2"}))
	require.NoError(t, err)
	assert.Equal(t, "build", st.Name())
	assert.Equal(t, 1, st.Attempt())
	assert.Same(t, r, st.Run())
	require.NoError(t, st.WriteFile("artifacts/out.bin", []byte("out")))
	require.NoError(t, st.Complete())

	before := readLedgerBytes(t, dir)
	_, err = r.Begin(ctx, "build", runstate.Value("flags", []string{"-O2"}))
	require.ErrorIs(t, err, runstate.ErrDone)
	assert.Equal(t, before, readLedgerBytes(t, dir), "Begin of a done stage writes nothing")

	called := false
	require.NoError(t, r.Do(ctx, "build", func(context.Context, *runstate.Stage) error { called = true; return nil },
		runstate.Value("flags", []string{"-O2"})))
	assert.False(t, called, "Do must not call fn for a done stage")
	assert.Equal(t, before, readLedgerBytes(t, dir))

	// A fresh session sees the same.
	require.NoError(t, r.Close())
	r = openRun(t, dir, testOptions())
	_, err = r.Begin(ctx, "build", runstate.Value("flags", []string{"-O2"}))
	require.ErrorIs(t, err, runstate.ErrDone)
	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, 0, s.Metrics.DuplicatedWork)
}

func TestBeginRedoesWhenInputChanged(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	src := filepath.Join(t.TempDir(), "parser.go")
	require.NoError(t, os.WriteFile(src, []byte("package parser // v1\n"), 0o644))
	runs := 0
	fn := func(_ context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("artifacts/tests.go", []byte("tests"))
	}
	require.NoError(t, r.Do(ctx, "test", fn, runstate.File(src)))
	require.NoError(t, r.Do(ctx, "test", fn, runstate.File(src)))
	assert.Equal(t, 1, runs)

	require.NoError(t, os.WriteFile(src, []byte("package parser // v2\n"), 0o644))
	require.NoError(t, r.Do(ctx, "test", fn, runstate.File(src)))
	assert.Equal(t, 2, runs, "a changed input redoes the stage")

	lines := checkLedger(t, dir)
	inv := events(lines, "invalidate", "test")
	require.Len(t, inv, 1)
	assert.Equal(t, "input "+src+" changed", inv[0].Reason)
	assert.Empty(t, inv[0].By, "not an operator's invalidation")
	begins := events(lines, "begin", "test")
	require.Len(t, begins, 2)
	assert.NotEqual(t, begins[0].Inputs[src], begins[1].Inputs[src])
	assert.Equal(t, 2, begins[1].Attempt)

	// Value inputs too, named by their name.
	require.NoError(t, r.Do(ctx, "gen", fn, runstate.Value("prompt", "one")))
	require.NoError(t, r.Do(ctx, "gen", fn, runstate.Value("prompt", "two")))
	assert.Equal(t, 4, runs)
	inv = events(checkLedger(t, dir), "invalidate", "gen")
	require.Len(t, inv, 1)
	assert.Equal(t, "input prompt changed", inv[0].Reason)

	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, 2, s.Metrics.StaleRejections)
	assert.Equal(t, 0, s.Metrics.DuplicatedWork)
}

func TestBeginRedoesWhenOutputMissingOrAltered(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	runs := 0
	fn := func(_ context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("artifacts/x", []byte("the output"))
	}
	require.NoError(t, r.Do(ctx, "s", fn))

	out := filepath.Join(dir, "artifacts", "x")
	require.NoError(t, os.Remove(out))
	require.NoError(t, r.Do(ctx, "s", fn))
	assert.Equal(t, 2, runs)
	inv := events(checkLedger(t, dir), "invalidate", "s")
	require.Len(t, inv, 1)
	assert.Equal(t, "output artifacts/x missing", inv[0].Reason)

	require.NoError(t, os.WriteFile(out, []byte("the 0utput"), 0o644)) // same size, other bytes
	require.NoError(t, r.Do(ctx, "s", fn))
	assert.Equal(t, 3, runs)
	inv = events(checkLedger(t, dir), "invalidate", "s")
	require.Len(t, inv, 2)
	assert.True(t, strings.HasPrefix(inv[1].Reason, "output artifacts/x altered"), inv[1].Reason)

	require.NoError(t, r.Do(ctx, "s", fn))
	assert.Equal(t, 3, runs, "restored output: done")
}

// Two stages that write one file redo each other on every run: each
// one's attempt replaces the other's recorded output. The reason of the
// redo says so, and names the other stage, where "output x altered" alone
// left the user to find out why; a stage whose output a person altered
// gets the plain reason (the test above).
func TestTwoStagesThatWriteOneFileAreNamedInTheReason(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	fn := func(name string) func(context.Context, *runstate.Stage) error {
		return func(_ context.Context, st *runstate.Stage) error {
			return st.WriteFile("artifacts/report", []byte("by "+name))
		}
	}
	require.NoError(t, r.Do(ctx, "a", fn("a")))
	require.NoError(t, r.Do(ctx, "b", fn("b")))
	st, err := r.Begin(ctx, "a")
	require.NoError(t, err, "a's output is b's now: a runs again")
	status, err := r.Status()
	require.NoError(t, err)
	bStatus, _ := status.Stage("b")
	want := fmt.Sprintf("; stage b records it too (seq %d): two stages writing one file redo each other: give each its own path", bStatus.DoneSeq)
	assert.True(t, strings.HasPrefix(st.Reason(), "output artifacts/report altered ("), st.Reason())
	assert.True(t, strings.HasSuffix(st.Reason(), want), st.Reason())
	require.NoError(t, st.WriteFile("artifacts/report", []byte("by a")))
	require.NoError(t, st.Complete())
	inv := events(checkLedger(t, dir), "invalidate", "a")
	require.Len(t, inv, 1)
	assert.Equal(t, st.Reason(), inv[0].Reason, "the invalidate record keeps it")
}

func TestInputChangedWhileRunningIsStale(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	src := filepath.Join(t.TempDir(), "input.txt")
	require.NoError(t, os.WriteFile(src, []byte("v1"), 0o644))

	st, err := r.Begin(ctx, "s", runstate.File(src))
	require.NoError(t, err)
	require.NoError(t, st.WriteFile("artifacts/s.txt", []byte("made from v1")))
	require.NoError(t, os.WriteFile(src, []byte("v2"), 0o644))
	err = st.Complete()
	require.ErrorIs(t, err, runstate.ErrStale)
	assert.Contains(t, err.Error(), src)

	last := lastRecord(t, dir)
	assert.Equal(t, "invalidate", last.Ev)
	assert.Equal(t, "input "+src+" changed while the stage ran", last.Reason)
	assert.Empty(t, events(checkLedger(t, dir), "complete", "s"), "a stale result is never complete")
	s, err := r.Status()
	require.NoError(t, err)
	ss, _ := s.Stage("s")
	assert.Equal(t, runstate.StatePending, ss.State)
	assert.ErrorIs(t, st.Complete(), runstate.ErrClosed, "the attempt ended")

	// The next Begin runs it again from v2.
	runs := 0
	require.NoError(t, r.Do(ctx, "s", func(_ context.Context, st *runstate.Stage) error {
		runs++
		return st.WriteFile("artifacts/s.txt", []byte("made from v2"))
	}, runstate.File(src)))
	assert.Equal(t, 1, runs)
	comp := events(checkLedger(t, dir), "complete", "s")
	require.Len(t, comp, 1)
	assert.Equal(t, fileFingerprint(t, src), comp[0].Inputs[src])
}

func fileFingerprint(t testing.TB, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	require.NoError(t, err)
	return "sha256:" + sha256Hex(data)
}

func TestInputRemovedWhileRunningIsStale(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	src := filepath.Join(t.TempDir(), "input.txt")
	require.NoError(t, os.WriteFile(src, []byte("v1"), 0o644))
	st, err := r.Begin(ctx, "s", runstate.File(src))
	require.NoError(t, err)
	require.NoError(t, os.Remove(src))
	require.ErrorIs(t, st.Complete(), runstate.ErrStale)
	assert.Equal(t, "invalidate", lastRecord(t, dir).Ev)
}

func TestAfterCascades(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	upRuns, downRuns := 0, 0
	up := func(content string) func(context.Context, *runstate.Stage) error {
		return func(_ context.Context, st *runstate.Stage) error {
			upRuns++
			return st.WriteFile("artifacts/up.txt", []byte(content))
		}
	}
	down := func(_ context.Context, st *runstate.Stage) error {
		downRuns++
		return st.WriteFile("artifacts/down.txt", []byte("down"))
	}

	_, err := r.Begin(ctx, "down", runstate.After("up"))
	require.ErrorIs(t, err, runstate.ErrNotReady, "After needs the stage done")

	require.NoError(t, r.Do(ctx, "up", up("one"), runstate.Value("v", 1)))
	require.NoError(t, r.Do(ctx, "down", down, runstate.After("up")))
	require.NoError(t, r.Do(ctx, "down", down, runstate.After("up")))
	assert.Equal(t, 1, downRuns)

	// Upstream redone (its input changed) with identical output: the
	// downstream stage's evidence still holds.
	require.NoError(t, r.Do(ctx, "up", up("one"), runstate.Value("v", 2)))
	assert.Equal(t, 2, upRuns)
	require.NoError(t, r.Do(ctx, "down", down, runstate.After("up")))
	assert.Equal(t, 1, downRuns, "identical upstream output must not redo downstream")

	// Upstream redone by an operator, identical output: still holds.
	require.NoError(t, r.Invalidate(ctx, "up", "re-check"))
	_, err = r.Begin(ctx, "down", runstate.After("up"))
	require.ErrorIs(t, err, runstate.ErrNotReady, "up is not done until it is redone")
	require.NoError(t, r.Do(ctx, "up", up("one"), runstate.Value("v", 2)))
	require.NoError(t, r.Do(ctx, "down", down, runstate.After("up")))
	assert.Equal(t, 1, downRuns)

	// Upstream redone with different output: downstream is redone.
	require.NoError(t, r.Do(ctx, "up", up("two"), runstate.Value("v", 3)))
	require.NoError(t, r.Do(ctx, "down", down, runstate.After("up")))
	assert.Equal(t, 2, downRuns)
	inv := events(checkLedger(t, dir), "invalidate", "down")
	require.Len(t, inv, 1)
	assert.Contains(t, inv[0].Reason, "input after:up changed")
}

func TestValidForExpires(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	runs := 0
	fn := func(context.Context, *runstate.Stage) error { runs++; return nil }
	require.NoError(t, r.Do(ctx, "probe", fn, runstate.ValidFor(time.Hour)))
	require.NoError(t, r.Do(ctx, "probe", fn, runstate.ValidFor(time.Hour)))
	assert.Equal(t, 1, runs)
	require.NoError(t, r.Do(ctx, "quick", fn, runstate.ValidFor(30*time.Millisecond)))
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, r.Do(ctx, "quick", fn, runstate.ValidFor(30*time.Millisecond)))
	assert.Equal(t, 3, runs, "expired evidence redoes the stage")
	inv := events(checkLedger(t, dir), "invalidate", "quick")
	require.Len(t, inv, 1)
	assert.Contains(t, inv[0].Reason, "expired")
	require.NoError(t, r.Do(ctx, "probe", fn, runstate.ValidFor(time.Hour)))
	assert.Equal(t, 3, runs)

	// Zero or less sets no expiry, as its doc says.
	for _, d := range []time.Duration{0, -time.Hour} {
		require.NoError(t, r.Do(ctx, "forever", fn, runstate.ValidFor(d)))
	}
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, r.Do(ctx, "forever", fn, runstate.ValidFor(0)))
	assert.Equal(t, 4, runs, "ValidFor(0) and ValidFor(-1h): the stage ran once")
}

func TestStageWriteFile(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "w")
	require.NoError(t, err)
	require.NoError(t, st.WriteFile("artifacts/deep/dir/a.txt", []byte("aaa")))
	require.NoError(t, st.WriteFile(filepath.Join(dir, "artifacts", "b.txt"), []byte("bb")), "absolute path inside the run")
	require.NoError(t, st.WriteFile("artifacts/a2.txt", []byte("first")))
	require.NoError(t, st.WriteFile("artifacts/a2.txt", []byte("second"))) // the last write counts
	require.NoError(t, st.Complete())

	for p, want := range map[string]string{"artifacts/deep/dir/a.txt": "aaa", "artifacts/b.txt": "bb", "artifacts/a2.txt": "second"} {
		got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(p)))
		require.NoError(t, err)
		assert.Equal(t, want, string(got), p)
	}
	comp := events(checkLedger(t, dir), "complete", "w")[0]
	assert.Equal(t, []runstate.Output{
		{Path: "artifacts/a2.txt", SHA256: sha256Hex([]byte("second")), Size: 6},
		{Path: "artifacts/b.txt", SHA256: sha256Hex([]byte("bb")), Size: 2},
		{Path: "artifacts/deep/dir/a.txt", SHA256: sha256Hex([]byte("aaa")), Size: 3},
	}, comp.Outputs)
	assertNoTempFiles(t, dir)

	s, err := r.Status()
	require.NoError(t, err)
	assert.Len(t, s.Artifacts, 3)
}

// assertNoTempFiles checks that artifacts/ holds only real outputs and
// logs/tmp is empty.
func assertNoTempFiles(t testing.TB, dir string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "logs", "tmp"))
	if err == nil {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		assert.Empty(t, names, "temp files left in logs/tmp")
	}
	_ = filepath.WalkDir(filepath.Join(dir, "artifacts"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			assert.NotContains(t, d.Name(), "tmp", "temp file in artifacts: %s", p)
		}
		return nil
	})
}

// TestStageWriteFileAtomic reads the file while WriteFile replaces it: a
// reader sees the old content or the new one, never part of either.
func TestStageWriteFileAtomic(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "w")
	require.NoError(t, err)
	small := bytes.Repeat([]byte("a"), 10)
	big := bytes.Repeat([]byte("b"), 64<<10)
	require.NoError(t, st.WriteFile("artifacts/f", small))

	stop := make(chan struct{})
	bad := make(chan string, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			got, err := os.ReadFile(filepath.Join(dir, "artifacts", "f"))
			if err != nil || !(bytes.Equal(got, small) || bytes.Equal(got, big)) {
				select {
				case bad <- "torn read: " + strconv.Itoa(len(got)) + " bytes, err " + errString(err):
				default:
				}
				return
			}
		}
	}()
	for i := 0; i < 100; i++ {
		data := small
		if i%2 == 0 {
			data = big
		}
		require.NoError(t, st.WriteFile("artifacts/f", data))
	}
	close(stop)
	wg.Wait()
	select {
	case msg := <-bad:
		t.Fatal(msg)
	default:
	}
	require.NoError(t, st.Complete())
	assertNoTempFiles(t, dir)
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func TestStageOutput(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "o")
	require.NoError(t, err)
	require.NoError(t, st.Output("artifacts/by-hand.txt"))
	// Written after Output is called: it is hashed at Complete.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "artifacts"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "artifacts", "by-hand.txt"), []byte("early"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "artifacts", "by-hand.txt"), []byte("final"), 0o644))
	require.NoError(t, st.Complete())
	comp := events(checkLedger(t, dir), "complete", "o")[0]
	assert.Equal(t, []runstate.Output{{Path: "artifacts/by-hand.txt", SHA256: sha256Hex([]byte("final")), Size: 5}}, comp.Outputs)

	// A declared output that is missing at Complete is an error naming
	// it; the stage is not complete and the attempt can still end.
	st, err = r.Begin(ctx, "missing")
	require.NoError(t, err)
	require.NoError(t, st.Output("artifacts/never-written.txt"))
	before := readLedgerBytes(t, dir)
	err = st.Complete()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "artifacts/never-written.txt")
	assert.Contains(t, err.Error(), "does not exist")
	assert.Equal(t, before, readLedgerBytes(t, dir))
	require.NoError(t, st.Fail(err))
	assert.Empty(t, events(checkLedger(t, dir), "complete", "missing"))
}

// TestDoOfItsOwnStageFromFn: a fn that calls Do of its own stage gets
// ErrBusy that says the stage runs in this session because its Stage has
// not ended, and what not to do. It said "wait for it to end (if that
// process died ...)": from inside fn, waiting never ends.
func TestDoOfItsOwnStageFromFn(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRun(t)
	var inner error
	require.NoError(t, r.Do(ctx, "s", func(ctx context.Context, _ *runstate.Stage) error {
		inner = r.Do(ctx, "s", func(context.Context, *runstate.Stage) error { return nil })
		return nil
	}))
	require.ErrorIs(t, inner, runstate.ErrBusy)
	assert.Contains(t, inner.Error(), "s attempt 1 is running in this session: its Stage has not ended (Complete, Fail or Await it; a Do's fn must not Do or Begin its own stage)")
	assert.NotContains(t, inner.Error(), "process died")
}

// TestDoWithoutFnIsRefused: Do with a nil fn is ErrInvalid, with nothing
// recorded, as Effect without a Do is. It began the stage, then recorded
// the nil pointer dereference as a failed attempt, counted toward
// MaxAttempts, and panicked.
func TestDoWithoutFnIsRefused(t *testing.T) {
	r, dir := newTestRun(t)
	before := readLedgerBytes(t, dir)
	var err error
	assert.NotPanics(t, func() { err = r.Do(context.Background(), "n", nil) })
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), `Do of stage "n" needs a fn to run`)
	assert.Equal(t, before, readLedgerBytes(t, dir), "nothing recorded")
}

func TestDoRecordsPanic(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	func() {
		defer func() {
			assert.Equal(t, "boom", recover(), "Do re-panics with fn's value")
		}()
		_ = r.Do(ctx, "p", func(context.Context, *runstate.Stage) error { panic("boom") })
		t.Error("Do returned after a panic")
	}()
	last := lastRecord(t, dir)
	assert.Equal(t, "fail", last.Ev)
	assert.Equal(t, "p", last.Stage)
	assert.Contains(t, last.Error, "panic: boom")
	s, err := r.Status()
	require.NoError(t, err)
	ps, _ := s.Stage("p")
	assert.Equal(t, runstate.StateFailed, ps.State)

	// The stage can run again.
	require.NoError(t, r.Do(ctx, "p", func(context.Context, *runstate.Stage) error { return nil }))
	assert.Equal(t, "complete", lastRecord(t, dir).Ev)
}

// TestDoWhoseFnCallsGoexit: a fn that ends its goroutine with
// runtime.Goexit (t.Fatal, or a failed require check, inside fn in a
// test) lets the goroutine end as Goexit does, with the attempt recorded
// as failed, and the stage runs again. Do re-panicked with the nil that
// recover returns for Goexit: "panic called with nil argument", which
// crashed the test binary with every other test in it.
func TestDoWhoseFnCallsGoexit(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	returned := make(chan bool, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = r.Do(ctx, "g", func(context.Context, *runstate.Stage) error {
			runtime.Goexit()
			return nil
		})
		returned <- true
	}()
	<-exited
	select {
	case <-returned:
		t.Error("Do returned after fn called runtime.Goexit")
	default:
	}
	last := lastRecord(t, dir)
	assert.Equal(t, "g", last.Stage)
	assert.Contains(t, last.Error, "fn called runtime.Goexit instead of returning (t.Fatal")

	// The stage can run again.
	require.NoError(t, r.Do(ctx, "g", func(context.Context, *runstate.Stage) error { return nil }))
	assert.Equal(t, "complete", lastRecord(t, dir).Ev)
}

func TestDoRecordsError(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	cause := errors.New("the tests do not compile")
	err := r.Do(ctx, "f", func(context.Context, *runstate.Stage) error { return cause })
	require.ErrorIs(t, err, cause)
	last := lastRecord(t, dir)
	assert.Equal(t, "fail", last.Ev)
	assert.Equal(t, cause.Error(), last.Error)
}

func TestSkip(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Plan(ctx, "build", "deploy"))
	require.NoError(t, r.Skip(ctx, "deploy", "docs-only change"))
	n := len(readLedgerBytes(t, dir))
	require.NoError(t, r.Skip(ctx, "deploy", "again"))
	assert.Len(t, readLedgerBytes(t, dir), n, "skipping a done stage writes nothing")
	_, err := r.Begin(ctx, "deploy")
	require.ErrorIs(t, err, runstate.ErrDone)
	s, err := r.Status()
	require.NoError(t, err)
	assert.Equal(t, 1, s.Done)
	assert.Equal(t, "build", s.Next)
}

// --- Projections ----------------------------------------------------------

func TestNextStepsCurrentAfterEveryCheckpoint(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	stages := []string{"inspect", "plan", "execute", "verify"}
	require.NoError(t, r.Plan(ctx, stages...))
	check := func(what string) string {
		t.Helper()
		seq, text := nextStepsSeq(t, dir)
		assert.Equal(t, lastRecord(t, dir).Seq, seq, "after %s", what)
		got, err := r.NextSteps()
		require.NoError(t, err)
		assert.Equal(t, got, text, "NextSteps and the file agree after %s", what)
		return text
	}
	check("Plan")
	for i, name := range stages[:3] {
		require.NoError(t, r.Do(ctx, name, writeStage("artifacts/"+name+".md", name)))
		text := check("Do " + name)
		assert.Contains(t, text, r.ID())
		assert.Contains(t, text, testRequest)
		assert.Contains(t, text, name+" complete")
		assert.Contains(t, text, "artifacts/"+name+".md")
		assert.Contains(t, text, stages[i+1], "names the next stage")
		assert.Contains(t, text, strconv.Itoa(i+1)+" of 4")
	}
	st, err := r.Begin(ctx, "verify")
	require.NoError(t, err)
	// A begin alone does not republish the handoff at once (the stage's
	// end will); a stage still running after handoffLag shows as running.
	seq, handoff := nextStepsSeq(t, dir)
	if last := lastRecord(t, dir).Seq; seq != last {
		assert.Equal(t, last-1, seq, "right after Begin the handoff lags by the begin record at most")
		assert.Contains(t, handoff, "next:     verify (not started)")
		require.Eventually(t, func() bool { s, _ := nextStepsSeq(t, dir); return s == last }, 5*time.Second, 5*time.Millisecond,
			"the handoff catches up with a begin within handoffLag")
	}
	assert.Contains(t, check("Begin"), "next:     verify (running, attempt 1)")
	require.NoError(t, st.Fail(runstate.NeedsPerson(errors.New("flaky test"), "decide whether the flake matters")))
	text := check("Fail")
	assert.Contains(t, text, "blockers: 1")
	assert.Contains(t, text, "decide whether the flake matters")
	assert.Contains(t, text, "runstate approve")
	require.NoError(t, r.Approve(ctx, "verify", "reviewer", "fine"))
	check("Approve")
	require.NoError(t, r.Do(ctx, "verify", writeStage("artifacts/verify.md", "ok")))
	text = check("last Do")
	assert.Contains(t, text, "4 of 4")
	assert.Contains(t, text, "blockers: none")
	assert.Contains(t, text, "logs/ledger.jsonl", "says where to look")
	assert.Contains(t, text, "manifest.json")
}

func TestNextStepsContent(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := openRun(t, dir, &runstate.Options{Request: testRequest, Revision: "3f2a1c9", Environment: map[string]string{"env": "staging"}, NoSync: true})
	require.NoError(t, r.Plan(ctx, "inspect", "plan", "execute"))
	require.NoError(t, r.Do(ctx, "inspect", writeStage("artifacts/inspect.md", "notes")))
	text, err := r.NextSteps()
	require.NoError(t, err)
	for _, want := range []string{
		"run " + r.ID(),
		"request:  " + testRequest,
		"revision: 3f2a1c9",
		"env=staging",
		"progress: 1 of 3 planned stages done (inspect)",
		"last:     inspect complete",
		"-> artifacts/inspect.md (sha256:" + sha256Hex([]byte("notes"))[:12],
		"next:     plan (not started)",
		"then:     execute",
		"blockers: none",
		"look at:  logs/ledger.jsonl",
	} {
		assert.Contains(t, text, want)
	}
	assert.Less(t, strings.Count(text, "\n"), 40, "one short page")
}

func TestNextStepsRebuiltOnOpen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Plan(ctx, "a", "b"))
	require.NoError(t, r.Do(ctx, "a", writeStage("artifacts/a", "a")))
	require.NoError(t, r.Close())
	_, old := nextStepsSeq(t, dir)
	p := filepath.Join(dir, "logs", "next-steps.txt")

	for _, tc := range []struct {
		name   string
		damage func() error
	}{
		{"deleted", func() error { return os.RemoveAll(p) }},
		{"garbage", func() error { return os.WriteFile(p, []byte("\x00\xffnot a handoff"), 0o644) }},
		{"behind", func() error {
			first, rest, _ := strings.Cut(old, "\n")
			first = regexp.MustCompile(`seq \d+`).ReplaceAllString(first, "seq 1")
			return os.WriteFile(p, []byte(first+"\n"+rest), 0o644)
		}},
		{"a dir", func() error { require.NoError(t, os.RemoveAll(p)); return os.Mkdir(p, 0o755) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, tc.damage())
			logs := &syncBuffer{}
			opts := testOptions()
			opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
			r := openRun(t, dir, opts)
			if tc.name == "a dir" {
				// It cannot be replaced; Open works and says so in the log.
				require.NoError(t, r.Close())
				assert.Contains(t, logs.String(), "next-steps.txt")
				require.NoError(t, os.RemoveAll(p))
				return
			}
			seq, text := nextStepsSeq(t, dir)
			assert.Equal(t, lastRecord(t, dir).Seq, seq)
			assert.Contains(t, text, "next:     b")
			require.NoError(t, r.Close())
			seq, _ = nextStepsSeq(t, dir)
			assert.Equal(t, lastRecord(t, dir).Seq, seq)
		})
	}
}

func TestManifest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	opts := testOptions()
	opts.ManifestInterval = time.Hour
	r := openRun(t, dir, opts)
	atOpen := readManifest(t, dir)
	assert.Equal(t, lastRecord(t, dir).Seq, atOpen.Seq, "written on Open")

	require.NoError(t, r.Plan(ctx, "a", "b", "c"))
	require.NoError(t, r.Do(ctx, "a", writeStage("artifacts/a", "a")))
	require.NoError(t, r.Do(ctx, "b", writeStage("artifacts/b", "b")))
	assert.Equal(t, atOpen.Seq, readManifest(t, dir).Seq, "not rewritten more often than ManifestInterval")

	require.NoError(t, r.Close())
	m := readManifest(t, dir)
	data := readLedgerBytes(t, dir)
	lines := parseLedger(t, data)
	last := lines[len(lines)-1]
	assert.Equal(t, last.rec.Seq, m.Seq, "written on Close")
	assert.Equal(t, int64(len(data)), m.Ledger.End)
	assert.Equal(t, last.offset, m.Ledger.Offset)
	assert.Equal(t, sha256Hex(last.raw), m.Ledger.Hash)
	assert.Equal(t, 1, m.Format)
	assert.Equal(t, r.ID(), m.ID)
	assert.Equal(t, testRequest, m.Request)
	assert.Equal(t, []string{"a", "b", "c"}, m.Plan)
	states := map[string]string{}
	for _, s := range m.Stages {
		states[s.Name] = s.State
	}
	assert.Equal(t, map[string]string{"a": "complete", "b": "complete", "c": "pending"}, states)

	// A short interval: the first append after it has passed rewrites it,
	// the next one within the interval does not. The interval is longer
	// where a rewrite is slow (50 times its cost: on a busy machine the
	// Open's rewrite can take over 6 ms), so the test waits for the one in
	// force.
	opts.ManifestInterval = 300 * time.Millisecond
	r = openRun(t, dir, opts)
	time.Sleep(runstate.EffectiveManifestInterval(r) + 50*time.Millisecond)
	require.NoError(t, r.Skip(ctx, "c", "not needed"))
	seq := lastRecord(t, dir).Seq
	assert.Equal(t, seq, readManifest(t, dir).Seq)
	require.NoError(t, r.Skip(ctx, "d", "not needed"))
	assert.Equal(t, seq, readManifest(t, dir).Seq, "within the interval")
	require.NoError(t, r.Close())

	// A negative interval: after every append.
	opts.ManifestInterval = -1
	r = openRun(t, dir, opts)
	for _, n := range []string{"e", "f"} {
		require.NoError(t, r.Do(ctx, n, writeStage("artifacts/"+n, n)))
		assert.Equal(t, lastRecord(t, dir).Seq, readManifest(t, dir).Seq)
	}
}

func TestManifestRebuiltWhenUnreadable(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Plan(ctx, "a", "b"))
	require.NoError(t, r.Do(ctx, "a", writeStage("artifacts/a", "a")))
	require.NoError(t, r.Close())
	mp := filepath.Join(dir, "manifest.json")

	for name, damage := range map[string][]byte{
		"garbage":   []byte("{\"seq\": 12, \"ledger\": {tru"),
		"empty":     nil,
		"format 99": []byte(`{"format":99,"seq":3,"ledger":{"offset":0,"end":10,"hash":"` + strings.Repeat("0", 64) + `"}}`),
	} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, os.WriteFile(mp, damage, 0o644))
			r := openRun(t, dir, testOptions())
			s, err := r.Status()
			require.NoError(t, err)
			ss, _ := s.Stage("a")
			assert.Equal(t, runstate.StateComplete, ss.State, "state rebuilt from the ledger")
			assert.Equal(t, lastRecord(t, dir).Seq, readManifest(t, dir).Seq, "manifest rewritten on Open")
			require.NoError(t, r.Close())
			assertVerifies(t, dir)
		})
	}
}

func TestStatusAndInspectAgree(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Plan(ctx, "a", "b"))
	require.NoError(t, r.Do(ctx, "a", writeStage("artifacts/a", "a")))
	s, err := r.Status()
	require.NoError(t, err)
	in, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, s.Seq, in.Seq)
	asJSON := func(v any) string { b, err := json.Marshal(v); require.NoError(t, err); return string(b) }
	assert.JSONEq(t, asJSON(s.Stages), asJSON(in.Stages))
	assert.Equal(t, s.Artifacts, in.Artifacts)
	assert.Equal(t, s.ID, in.ID)
	assert.Equal(t, 1, in.Done)
	assert.Equal(t, "b", in.Next)
}

func TestStageFail(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "f")
	require.NoError(t, err)
	require.NoError(t, st.Fail(nil), "Fail(nil) does not end the attempt")
	require.NoError(t, st.WriteFile("artifacts/partial", []byte("p")))
	require.NoError(t, st.Fail(errors.New("network down")))
	last := lastRecord(t, dir)
	assert.Equal(t, "fail", last.Ev)
	assert.Equal(t, "f", last.Stage)
	assert.Equal(t, 1, last.Attempt)
	assert.Equal(t, runstate.ClassRetryable, last.Class, "an unclassified error is retryable")
	assert.Equal(t, "network down", last.Error)
	assert.Empty(t, last.Outputs, "a failed attempt records no outputs")

	st, err = r.Begin(ctx, "f")
	require.NoError(t, err, "a retryable failure may begin again")
	assert.Equal(t, 2, st.Attempt())
	require.NoError(t, st.Fail(runstate.Fatal(errors.New("schema is gone"))))
	assert.Equal(t, runstate.ClassFatal, lastRecord(t, dir).Class)
	_, err = r.Begin(ctx, "f")
	require.ErrorIs(t, err, runstate.ErrFatal)
	assert.Contains(t, err.Error(), "schema is gone")

	s, err := r.Status()
	require.NoError(t, err)
	fs, _ := s.Stage("f")
	assert.Equal(t, runstate.StateFatal, fs.State)
	assert.Equal(t, 2, s.Metrics.Failures)
	require.Len(t, s.Blockers, 1)
	assert.Equal(t, "fatal", s.Blockers[0].Kind)
}

// A stage After itself could never begin (ErrNotReady for ever, or, once
// done, stale at every Begin): Begin refuses it with ErrInvalid, nothing
// recorded.
func TestAfterItselfIsInvalid(t *testing.T) {
	ctx := context.Background()
	r, err := runstate.Open(t.TempDir(), &runstate.Options{Request: "self"})
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Begin(ctx, "b", runstate.After("b"))
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "stage b cannot be After itself")
	status, err := r.Status()
	require.NoError(t, err)
	_, ok := status.Stage("b")
	assert.False(t, ok, "nothing recorded")
}
