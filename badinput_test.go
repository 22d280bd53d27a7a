package runstate_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// Bad input: each gets a clear error that names the file (or the stage)
// and what is wrong, and nothing already recorded is lost.

func TestBadInputMissingDirIsCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not", "there", "yet")
	r := openRun(t, dir, testOptions())
	require.NoError(t, r.Close())
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.True(t, fi.IsDir())
	checkLedger(t, dir)
}

func TestBadInputNoDir(t *testing.T) {
	_, err := runstate.Open("", testOptions())
	require.ErrorIs(t, err, runstate.ErrInvalid)
}

// TestBadInputUnwritableDir: a directory Open cannot write in. Tests may
// run as root, for whom chmod does not bite; then a file where logs/
// should be stands in for it.
func TestBadInputUnwritableDir(t *testing.T) {
	t.Run("new run, chmod 0555", func(t *testing.T) {
		if runtime.GOOS == "windows" {
			return // no POSIX modes; the file-in-the-way cases below apply
		}
		dir := t.TempDir()
		require.NoError(t, os.Chmod(dir, 0o555))
		defer os.Chmod(dir, 0o755)
		_, err := runstate.Open(dir, testOptions())
		if os.Geteuid() == 0 {
			// root writes anyway: the run is created, which is right.
			require.NoError(t, err)
			return
		}
		require.Error(t, err)
		assert.ErrorIs(t, err, fs.ErrPermission)
		assert.Contains(t, err.Error(), filepath.Join(dir, "logs"))
		assert.Contains(t, err.Error(), "writable")
	})
	t.Run("existing run, chmod 0555 on logs", func(t *testing.T) {
		if runtime.GOOS == "windows" || os.Geteuid() == 0 {
			return // covered for everyone by the file-in-the-way cases
		}
		dir := buildRun(t)
		before := readLedgerBytes(t, dir)
		logs := filepath.Join(dir, "logs")
		require.NoError(t, os.Chmod(filepath.Join(logs, "sessions"), 0o555))
		defer os.Chmod(filepath.Join(logs, "sessions"), 0o755)
		_, err := runstate.Open(dir, testOptions())
		require.Error(t, err)
		assert.ErrorIs(t, err, fs.ErrPermission)
		assert.Contains(t, err.Error(), filepath.Join(logs, "sessions"))
		assert.Equal(t, before, readLedgerBytes(t, dir))
	})
	t.Run("new run, a file where logs/ should be", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "logs"), []byte("mine"), 0o644))
		_, err := runstate.Open(dir, testOptions())
		require.Error(t, err)
		assert.Contains(t, err.Error(), filepath.Join(dir, "logs"), "names the path")
		assert.Contains(t, err.Error(), "writable", "says what to check")
		data, _ := os.ReadFile(filepath.Join(dir, "logs"))
		assert.Equal(t, "mine", string(data), "the file in the way is not touched")
	})
	t.Run("existing run, a file where logs/tmp should be", func(t *testing.T) {
		dir := buildRun(t)
		before := readLedgerBytes(t, dir)
		tmp := filepath.Join(dir, "logs", "tmp")
		require.NoError(t, os.RemoveAll(tmp))
		require.NoError(t, os.WriteFile(tmp, []byte("in the way"), 0o644))
		_, err := runstate.Open(dir, testOptions())
		require.Error(t, err)
		assert.Contains(t, err.Error(), tmp)
		assert.Equal(t, before, readLedgerBytes(t, dir), "nothing recorded is lost")
		require.NoError(t, os.Remove(tmp))
		r := openRun(t, dir, testOptions())
		s, err := r.Status()
		require.NoError(t, err)
		assert.Equal(t, 3, s.Done, "the run is intact once the way is clear")
	})
	t.Run("existing run, a file where logs/sessions should be", func(t *testing.T) {
		dir := buildRun(t)
		before := readLedgerBytes(t, dir)
		ses := filepath.Join(dir, "logs", "sessions")
		require.NoError(t, os.RemoveAll(ses))
		require.NoError(t, os.WriteFile(ses, nil, 0o644))
		_, err := runstate.Open(dir, testOptions())
		require.Error(t, err)
		assert.Contains(t, err.Error(), ses)
		assert.Equal(t, before, readLedgerBytes(t, dir))
	})
}

func TestBadInputFileWhereDirShouldBe(t *testing.T) {
	p := filepath.Join(t.TempDir(), "run")
	require.NoError(t, os.WriteFile(p, []byte("a file"), 0o644))
	_, err := runstate.Open(p, testOptions())
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)
	assert.Contains(t, err.Error(), "is a file")
	assert.Contains(t, err.Error(), "pass a directory")
	data, _ := os.ReadFile(p)
	assert.Equal(t, "a file", string(data))

	_, err = runstate.Inspect(p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)
}

func TestBadInputLedgerIsADirectory(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs", "ledger.jsonl"), 0o755))
	_, err := runstate.Open(dir, testOptions())
	require.Error(t, err)
	assert.Contains(t, err.Error(), ledgerPath(dir))
	assert.Contains(t, err.Error(), "is a directory")
	_, err = runstate.Inspect(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), ledgerPath(dir))
	fi, err := os.Stat(ledgerPath(dir))
	require.NoError(t, err)
	assert.True(t, fi.IsDir(), "left as it was")
}

func TestBadInputNotARun(t *testing.T) {
	dir := t.TempDir()
	_, err := runstate.Inspect(dir)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a run directory")
	_, err = runstate.Inspect(filepath.Join(dir, "missing"))
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

func TestBadInputRequestMismatch(t *testing.T) {
	dir := buildRun(t)
	before := readLedgerBytes(t, dir)
	_, err := runstate.Open(dir, &runstate.Options{Request: "another task"})
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), dir)
	assert.Contains(t, err.Error(), testRequest)
	assert.Contains(t, err.Error(), "another task")
	assert.Contains(t, err.Error(), "use another directory")
	assert.Equal(t, before, readLedgerBytes(t, dir))
}

var badStageNames = map[string]string{
	"empty":            "",
	"newline":          "a\nb",
	"tab":              "a\tb",
	"NUL":              "a\x00b",
	"escape sequence":  "\x1b[31mred",
	"DEL":              "a\x7f",
	"C1 control":       "a\u0085b",
	"invalid UTF-8":    "a\xffb",
	"leading space":    " a",
	"trailing newline": "a\n",
	"too long":         strings.Repeat("x", 300),
}

func TestBadInputStageNames(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Do(ctx, "good", writeStage("artifacts/good", "g")))
	before := readLedgerBytes(t, dir)
	fn := func(context.Context, *runstate.Stage) error { t.Error("fn called for a bad name"); return nil }
	for what, name := range badStageNames {
		calls := map[string]error{
			"Plan":       r.Plan(ctx, "good", name),
			"Do":         r.Do(ctx, name, fn),
			"Skip":       r.Skip(ctx, name, "why"),
			"Approve":    r.Approve(ctx, name, "me", ""),
			"Invalidate": r.Invalidate(ctx, name, "why"),
			"After":      r.Do(ctx, "x", fn, runstate.After(name)),
		}
		_, calls["Begin"] = r.Begin(ctx, name)
		for call, err := range calls {
			require.Error(t, err, "%s(%s)", call, what)
			assert.ErrorIs(t, err, runstate.ErrInvalid, "%s(%s)", call, what)
			// "stage name ..." (or "input name ..." for After's input).
			assert.Regexp(t, `(stage|input) name`, err.Error(), "%s(%s): says what is wrong", call, what)
		}
	}
	assert.Equal(t, before, readLedgerBytes(t, dir), "bad names record nothing")
	// Names that are fine, even if unusual.
	for _, name := range []string{"execute/file-3", "ünïcödé", "a b", "1", strings.Repeat("x", 256)} {
		require.NoError(t, r.Do(ctx, name, func(context.Context, *runstate.Stage) error { return nil }), name)
	}
}

func TestBadInputOutputPaths(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	outside := t.TempDir()
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	bad := []string{
		"",
		"..",
		"../x",
		"../../etc/passwd",
		"artifacts/../../x",
		"./../x",
		filepath.Join(outside, "x"),
		filepath.Join(dir, "..", "x"),
		dir,
		".",
		"logs/ledger.jsonl",
		"logs/next-steps.txt",
		"logs/x",
		"manifest.json",
		filepath.Join(dir, "manifest.json"),
	}
	for _, p := range bad {
		err := st.WriteFile(p, []byte("x"))
		assert.ErrorIs(t, err, runstate.ErrInvalid, "WriteFile(%q)", p)
		if err != nil && p != "" {
			assert.Contains(t, err.Error(), "output", "WriteFile(%q): %v", p, err)
		}
		assert.ErrorIs(t, st.Output(p), runstate.ErrInvalid, "Output(%q)", p)
	}
	ents, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, ents, "nothing written outside the run")
	_, err = os.Stat(filepath.Join(filepath.Dir(dir), "x"))
	assert.ErrorIs(t, err, fs.ErrNotExist)

	// The stage is still usable, and records only its real outputs.
	require.NoError(t, st.WriteFile("artifacts/ok", []byte("ok")))
	require.NoError(t, st.Complete())
	comp := events(checkLedger(t, dir), "complete", "s")
	require.Len(t, comp, 1)
	assert.Equal(t, []runstate.Output{{Path: "artifacts/ok", SHA256: sha256Hex([]byte("ok")), Size: 2}}, comp[0].Outputs)
}

// TestBadInputSymlinkOut: a symbolic link inside the run that leads out of
// it must not let an output escape, through WriteFile or Output.
func TestBadInputSymlinkOut(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "x"), []byte("outside"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644))
	if err := os.Symlink(outside, filepath.Join(dir, "artifacts")); err != nil {
		if runtime.GOOS == "windows" {
			return // creating symbolic links needs a privilege there
		}
		require.NoError(t, err)
	}
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "out"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "out", "link")))

	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	err = st.WriteFile("artifacts/x", []byte("escaped"))
	require.Error(t, err, "WriteFile through a symlinked artifacts/")
	assert.Contains(t, err.Error(), "artifacts/x")
	err = st.WriteFile("artifacts/new/y", []byte("escaped"))
	require.Error(t, err, "WriteFile into a new directory through a symlinked artifacts/")
	err = st.Output("artifacts/x")
	require.Error(t, err, "Output through a symlinked artifacts/")
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "artifacts/x")
	err = st.Output("out/link")
	require.Error(t, err, "Output of a symlink that points out")
	assert.ErrorIs(t, err, runstate.ErrInvalid)

	data, err := os.ReadFile(filepath.Join(outside, "x"))
	require.NoError(t, err)
	assert.Equal(t, "outside", string(data), "nothing written outside")
	_, err = os.Stat(filepath.Join(outside, "new"))
	assert.ErrorIs(t, err, fs.ErrNotExist)

	// A link replaced by WriteFile is replaced, not followed.
	require.NoError(t, st.WriteFile("out/link", []byte("inside")))
	data, err = os.ReadFile(filepath.Join(outside, "secret"))
	require.NoError(t, err)
	assert.Equal(t, "secret", string(data))

	// A link made after Output is refused at Complete.
	require.NoError(t, st.Output("out/later"))
	require.NoError(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "out", "later")))
	err = st.Complete()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "out/later")
	assert.Empty(t, events(checkLedger(t, dir), "complete", "s"), "nothing recorded from outside")
}

func TestBadInputMissingInputFile(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	missing := filepath.Join(t.TempDir(), "src", "parser.go")
	before := readLedgerBytes(t, dir)
	called := false
	err := r.Do(ctx, "s", func(context.Context, *runstate.Stage) error { called = true; return nil }, runstate.File(missing))
	require.Error(t, err)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Contains(t, err.Error(), missing)
	assert.Contains(t, err.Error(), "create it first")
	assert.False(t, called)
	_, err = r.Begin(ctx, "s", runstate.File(missing))
	require.ErrorIs(t, err, fs.ErrNotExist)
	assert.Equal(t, before, readLedgerBytes(t, dir), "a refused Begin records nothing")
}

func TestBadInputOtherInputs(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	before := readLedgerBytes(t, dir)
	_, err := r.Begin(ctx, "s", runstate.Value("ch", make(chan int)))
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), `"ch"`)
	_, err = r.Begin(ctx, "s", runstate.Value("v", 1), runstate.Value("v", 2))
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "twice")
	_, err = r.Begin(ctx, "s", runstate.After("t"), runstate.After("t"))
	require.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = r.Begin(ctx, "s", runstate.After("never-run"))
	require.ErrorIs(t, err, runstate.ErrNotReady)
	assert.Contains(t, err.Error(), "never-run")
	assert.Equal(t, before, readLedgerBytes(t, dir))

	require.ErrorIs(t, r.Approve(ctx, "s", " ", ""), runstate.ErrInvalid, "Approve needs a person")
	require.ErrorIs(t, r.Approve(ctx, "s", "me", ""), runstate.ErrInvalid, "s awaits nobody")
	require.ErrorIs(t, r.Invalidate(ctx, "s", ""), runstate.ErrInvalid, "Invalidate needs a reason")
	require.ErrorIs(t, r.Invalidate(ctx, "unknown", "why"), runstate.ErrInvalid)
	assert.Equal(t, before, readLedgerBytes(t, dir))

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Begin(cctx, "s")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, r.Plan(cctx, "s"), context.Canceled)
	assert.Equal(t, before, readLedgerBytes(t, dir))
}

// TestStageAfterItsAttemptEndedSaysHow: a Stage's methods after its
// attempt ended return ErrClosed saying how the attempt ended and what to
// do, not that the run is closed (it is not: the Run goes on). They read
// "runstate: run is closed: stage s attempt 1 already ended".
func TestStageAfterItsAttemptEndedSaysHow(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRun(t)
	for _, c := range []struct {
		stage, how string
		end        func(st *runstate.Stage) error
	}{
		{"c", "completed", func(st *runstate.Stage) error { return st.Complete() }},
		{"f", "failed", func(st *runstate.Stage) error { return st.Fail(errors.New("no")) }},
		{"w", "awaiting a person", func(st *runstate.Stage) error { return st.Await("review") }},
	} {
		st, err := r.Begin(ctx, c.stage)
		require.NoError(t, err)
		_ = c.end(st)
		err = st.WriteFile("artifacts/late", []byte("x"))
		require.ErrorIs(t, err, runstate.ErrClosed, c.stage)
		assert.Equal(t, "runstate: stage "+c.stage+" attempt 1 already ended ("+c.how+"): this Stage is done; Begin (or Do) the stage again for a new attempt", err.Error())
	}
	_, err := r.Status()
	require.NoError(t, err, "the Run is not closed")
}

func TestBadInputEndTwice(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "s")
	require.NoError(t, err)
	require.NoError(t, st.Complete())
	for what, err := range map[string]error{
		"Complete":  st.Complete(),
		"Fail":      st.Fail(errors.New("late")),
		"Await":     st.Await("late"),
		"WriteFile": st.WriteFile("artifacts/late", []byte("x")),
		"Output":    st.Output("artifacts/late"),
	} {
		require.ErrorIs(t, err, runstate.ErrClosed, what)
		assert.Contains(t, err.Error(), "already ended", what)
	}
	lines := checkLedger(t, dir)
	assert.Len(t, events(lines, "complete", "s"), 1)
	assert.Empty(t, events(lines, "fail", "s"))
	assert.NoFileExists(t, filepath.Join(dir, "artifacts", "late"))

	st, err = r.Begin(ctx, "f")
	require.NoError(t, err)
	require.NoError(t, st.Fail(errors.New("first")))
	require.ErrorIs(t, st.Complete(), runstate.ErrClosed)
	require.ErrorIs(t, st.Fail(errors.New("second")), runstate.ErrClosed)
	assert.Len(t, events(checkLedger(t, dir), "fail", "f"), 1)
}

// TestBadInputNothingLost: after every refused call above, the run still
// has its records and goes on.
func TestBadInputNothingLost(t *testing.T) {
	ctx := context.Background()
	dir := buildRun(t)
	before := readLedgerBytes(t, dir)
	_, _ = runstate.Open(dir, &runstate.Options{Request: "other"})
	r := openRun(t, dir, testOptions())
	_ = r.Plan(ctx, "")
	_, _ = r.Begin(ctx, "x", runstate.File(filepath.Join(dir, "nope")))
	st, err := r.Begin(ctx, "x")
	require.NoError(t, err)
	_ = st.WriteFile("../escape", []byte("x"))
	require.NoError(t, st.Complete())
	require.NoError(t, r.Close())
	after := readLedgerBytes(t, dir)
	assert.True(t, strings.HasPrefix(string(after), string(before)), "every earlier record is kept")
	assertVerifies(t, dir)
	s, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, 3, s.Done)
	x, _ := s.Stage("x")
	assert.Equal(t, runstate.StateComplete, x.State)
	assert.WithinDuration(t, time.Now(), x.DoneAt, time.Minute)
}

// TestValueAfterPrefixRefused: a Value named "after:X" would be recorded
// under the name After("X") records its fingerprint under, one silently
// replacing the other; Begin refuses it and records nothing.
func TestValueAfterPrefixRefused(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, r.Do(ctx, "x", func(context.Context, *runstate.Stage) error { return nil }))
	before := readLedgerBytes(t, dir)
	for _, inputs := range [][]runstate.Input{
		{runstate.Value("after:x", 1)},
		{runstate.After("x"), runstate.Value("after:x", 1)},
		{runstate.Value("after:x", 1), runstate.After("x")},
	} {
		_, err := r.Begin(ctx, "s", inputs...)
		require.Error(t, err)
		assert.ErrorIs(t, err, runstate.ErrInvalid)
		assert.Contains(t, err.Error(), `Value("after:x")`)
		assert.Contains(t, err.Error(), "reserved")
	}
	assert.Equal(t, before, readLedgerBytes(t, dir), "nothing recorded")
}

// Free text that is not valid UTF-8 (a Fail's error, a Skip's or an
// Await's reason, an Approve's by and note) is recorded, held and shown
// as a reader decodes it, each bad byte U+FFFD: the manifest a session
// writes from memory then matches the ledger. It held the raw bytes, and
// the manifest Close wrote failed its own checksum in Verify ("edited by
// hand, or damaged?").
func TestBadInputInvalidUTF8TextIsHeldAsRead(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	st, err := r.Begin(ctx, "f")
	require.NoError(t, err)
	require.NoError(t, st.Fail(errors.New("a\xffb\xfe\xfdc")))
	require.NoError(t, r.Skip(ctx, "s", "skip \xff"))
	st, err = r.Begin(ctx, "w")
	require.NoError(t, err)
	require.Error(t, st.Await("ask \xc3"), "Await returns the stage's need of a person")
	require.NoError(t, r.Approve(ctx, "w", "al\xffice", "ok \xff"))
	require.NoError(t, r.Close())

	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep.Problems)
	s, err := runstate.Inspect(dir)
	require.NoError(t, err)
	f, _ := s.Stage("f")
	assert.Contains(t, f.Error, "a\uFFFDb\uFFFD\uFFFDc", "one U+FFFD a bad byte")
	sk, _ := s.Stage("s")
	assert.Equal(t, "skip \uFFFD", sk.Reason)
	r = openRun(t, dir, testOptions())
	require.NoError(t, r.Close())
	rep, err = runstate.Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep.Problems)
}

// File("") and a directory with a NUL byte are refused with ErrInvalid,
// saying so: the first was "input  is a directory, not a regular file"
// (it named SourceDir), the second a bare "invalid argument".
func TestBadInputEmptyFileAndNULDir(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRun(t)
	_, err := r.Begin(ctx, "q", runstate.File(""))
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), `File(""): an empty path names no file`)

	_, err = runstate.Open(filepath.Join(t.TempDir(), "a\x00b"), testOptions())
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "holds a NUL byte")
}

// WriteFile over a directory is refused with ErrInvalid, naming the
// output as a directory: it was "renameat logs/tmp/… d: file exists".
func TestBadInputWriteFileOverADirectory(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "out", "d"), 0o755))
	st, err := r.Begin(ctx, "w")
	require.NoError(t, err)
	err = st.WriteFile("out/d", []byte("x"))
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "output out/d is a directory: an output is a file")
	assert.NotContains(t, err.Error(), "logs/tmp")
	entries, err := os.ReadDir(filepath.Join(dir, "logs", "tmp"))
	if err == nil {
		assert.Empty(t, entries, "no temporary file left")
	}
	fi, err := os.Stat(filepath.Join(dir, "out", "d"))
	require.NoError(t, err)
	assert.True(t, fi.IsDir(), "the directory is left as it was")

	// CheckOutput (before Begin) and Output say so too: CheckOutput
	// passed a directory.
	for _, err := range []error{r.CheckOutput("out/d"), st.Output("out/d")} {
		require.ErrorIs(t, err, runstate.ErrInvalid)
		assert.Contains(t, err.Error(), "output out/d is a directory: an output is a file")
	}
}

// A Do whose fn closes the run and returns the error that gave it (a
// WriteFile's ErrClosed) returns that error once: it was joined with the
// same error from recording the failure, the text given twice.
func TestBadInputDoClosedUnderItsFnSaysItOnce(t *testing.T) {
	ctx := context.Background()
	r, _ := newTestRun(t)
	err := r.Do(ctx, "c", func(ctx context.Context, st *runstate.Stage) error {
		require.NoError(t, r.Close())
		return st.WriteFile("out/x", []byte("x"))
	})
	require.ErrorIs(t, err, runstate.ErrClosed)
	assert.Equal(t, 1, strings.Count(err.Error(), "run is closed"), err.Error())
}

// A Flow that names a stage no Begin could be given (an empty name, a
// control character) is refused at Open with ErrInvalid: it let no stage
// begin, each Begin saying the run "starts with " and nothing.
func TestBadInputFlowWithABadNameIsRefusedAtOpen(t *testing.T) {
	for _, f := range []*runstate.Flow{
		{Start: []string{""}},
		{Next: map[string][]string{"a": {"b\nc"}}},
		{Next: map[string][]string{"": {"b"}}},
	} {
		o := testOptions()
		o.Flow = f
		_, err := runstate.Open(t.TempDir(), o)
		require.ErrorIs(t, err, runstate.ErrInvalid, "%+v", f)
		assert.Contains(t, err.Error(), "in Options.Flow.", "%+v", f)
	}
	o := testOptions()
	o.Flow = runstate.AgentFlow()
	r, err := runstate.Open(t.TempDir(), o)
	require.NoError(t, err)
	require.NoError(t, r.Close())
}
