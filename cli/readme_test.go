package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The transcripts in cmd/runstate/README.md are run here as they stand:
// each command of a block (the lines that start with "$ ") runs through
// sh in a scratch directory holding the runs the block names, and what it
// prints (standard output and error, in order) must be the block's text,
// but for what differs from one run to the next (ids, times, pids, host,
// ledger sizes and offsets, which depend on them).

const cmdReadme = "../cmd/runstate/README.md"

// readmeBlocks returns the fenced blocks of a README, without the fences.
func readmeBlocks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var blocks []string
	for _, m := range regexp.MustCompile("(?ms)^ *```[a-z]*\n(.*?)^ *```$").FindAllStringSubmatch(string(b), -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}

// readmeBlock returns the block whose first line is first.
func readmeBlock(t *testing.T, path, first string) string {
	t.Helper()
	for _, b := range readmeBlocks(t, path) {
		if line, _, _ := strings.Cut(b, "\n"); line == first {
			return b
		}
	}
	t.Fatalf("%s: no block starts with %q", path, first)
	return ""
}

// step is one command of a transcript and what it printed.
type step struct{ cmd, want string }

func transcript(block string) []step {
	var steps []step
	for _, line := range strings.SplitAfter(block, "\n") {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, step{cmd: strings.TrimSpace(cmd)})
			continue
		}
		if len(steps) > 0 {
			steps[len(steps)-1].want += line
		}
	}
	for i := range steps {
		steps[i].want = strings.TrimRight(steps[i].want, "\n")
	}
	return steps
}

var (
	normPid      = regexp.MustCompile(`pid \d+ on \S+`)
	normUUID     = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	normTime     = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z|\d{8}T\d{6}\.\d+Z`)
	normHash     = regexp.MustCompile(`\b[0-9a-f]{64}\b|\b[0-9a-f]{12}…`)
	normShort    = regexp.MustCompile(`\b[0-9a-f]{8}\b`)
	normBytes    = regexp.MustCompile(`\b\d{3,} bytes|byte \d{3,}|"bytes": \d+`)
	normDuration = regexp.MustCompile(`\t\d+\.\d+s\b`)
	normAge      = regexp.MustCompile(`\b\d+[smhd] ago`)
)

// normalize replaces what differs between two runs of the same transcript.
func normalize(s, work string) string {
	s = strings.ReplaceAll(s, work, "/srv/runs")
	s = normPid.ReplaceAllString(s, "pid PID on HOST")
	s = normUUID.ReplaceAllString(s, "UUID")
	s = normTime.ReplaceAllString(s, "TIME")
	s = normHash.ReplaceAllString(s, "HASH")
	s = normShort.ReplaceAllString(s, "SESSION")
	s = normBytes.ReplaceAllStringFunc(s, func(m string) string {
		return regexp.MustCompile(`\d+`).ReplaceAllString(m, "N")
	})
	s = normAge.ReplaceAllString(s, "AGE ago")
	return normDuration.ReplaceAllString(s, "\tDURATION")
}

// runTranscript runs block's commands in dir (work is the scratch root
// that /srv/runs stands for in the block) and checks what each printed.
func runTranscript(t *testing.T, block, work, dir string) {
	t.Helper()
	path := filepath.Dir(bin) + string(os.PathListSeparator) + os.Getenv("PATH")
	code := 0
	for _, s := range transcript(block) {
		var got string
		if s.cmd == "echo $?" {
			got = strconv.Itoa(code)
		} else {
			cmd := exec.Command("sh", "-c", regexp.MustCompile(`\s{2,}#.*$`).ReplaceAllString(s.cmd, ""))
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "PATH="+path)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			code = 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else {
				require.NoError(t, err, s.cmd)
			}
			got = strings.TrimRight(out.String(), "\n")
		}
		if !assert.Equal(t, normalize(s.want, work), normalize(got, work), "$ %s\n(cmd/runstate/README.md shows what this printed; the command now prints:)\n%s", s.cmd, got) {
			return
		}
	}
}

// The walk through one run: session 1 of a small program inspects and
// plans, files a ticket whose POST times out (unconfirmed), and ends
// execute with Await. The contents give the README's hashes.
func walkSession1(t *testing.T, dir string) {
	t.Helper()
	ctx := context.Background()
	r := openRun(t, dir)
	require.NoError(t, r.Plan(ctx, plan...))
	require.NoError(t, r.Do(ctx, "inspect", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/inspect.md", []byte("# inspect\nparser.go: 3 exported funcs\n"))
	}))
	require.NoError(t, r.Do(ctx, "plan", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/plan.md", []byte("# plan\n1. table tests\n2. fuzz amount parse\n"))
	}, runstate.After("inspect")))
	_, err := r.Effect(ctx, "ticket:BILL-7", runstate.Effect{
		Request: map[string]string{"title": "billing parser tests"},
		Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			return nil, errors.New("POST /issues: context deadline exceeded")
		},
	})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	err = r.Do(ctx, "execute", func(ctx context.Context, st *runstate.Stage) error {
		if err := st.WriteFile("artifacts/diff.patch", []byte("--- a/api.go\n+++ b/api.go\n@@ -1 +1 @@\n")); err != nil {
			return err
		}
		return st.Await("review artifacts/diff.patch: it changes the public API")
	}, runstate.After("plan"))
	require.ErrorIs(t, err, runstate.ErrNeedsPerson)
	require.NoError(t, r.Close())
}

// walkSeq25 goes on to seq 25: a person approves execute and resolves
// the ticket; session 3 is killed while verify runs; session 4 skips the
// three done stages and runs verify again.
func walkSeq25(t *testing.T, dir string) {
	t.Helper()
	walkSession1(t, dir)
	require.Zero(t, runCLI(t, "approve", dir, "execute", "-by", "alice@example.com", "-note", "API change agreed in review").code)
	require.Zero(t, runCLI(t, "resolve", dir, "ticket:BILL-7", "-sent", `{"issue":"BILL-7"}`, "-by", "bob").code)
	ctx := context.Background()
	r := openRun(t, dir)
	_, err := r.Begin(ctx, "verify", runstate.After("execute"))
	require.NoError(t, err)
	runstatetest.Crash(r)
	r = openRun(t, dir)
	noop := func(ctx context.Context, st *runstate.Stage) error { return nil }
	require.NoError(t, r.Do(ctx, "inspect", noop))
	require.NoError(t, r.Do(ctx, "plan", noop, runstate.After("inspect")))
	require.NoError(t, r.Do(ctx, "execute", noop, runstate.After("plan")))
	require.NoError(t, r.Do(ctx, "verify", noop, runstate.After("execute")))
	require.NoError(t, r.Close())
}

func TestReadmeWalkThrough(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the transcripts use GNU sed -i and sh")
	}
	seq12, seq25 := walkSession1, walkSeq25
	blocks := []struct {
		first string
		runs  map[string]func(*testing.T, string) // the runs the block names, made in the scratch directory
		edit  func(work string)
	}{
		{first: "$ runstate status billing", runs: map[string]func(*testing.T, string){"billing": seq12}},
		{first: "$ runstate log billing", runs: map[string]func(*testing.T, string){"billing": seq12}},
		{first: "$ runstate log -json billing -since 24", runs: map[string]func(*testing.T, string){"billing": seq25}},
		{first: `$ runstate approve billing execute -by alice@example.com -note "API change agreed in review"`,
			runs: map[string]func(*testing.T, string){"billing": seq12, "altered": seq25}},
		{first: "$ runstate next billing", runs: map[string]func(*testing.T, string){"billing": seq12}},
		{first: "$ runstate verify billing", runs: map[string]func(*testing.T, string){"billing": seq25, "altered": seq25}},
		{first: "$ runstate verify -json altered2", runs: map[string]func(*testing.T, string){"altered2": seq25}, edit: func(work string) {
			require.NoError(t, os.WriteFile(filepath.Join(work, "altered2", "artifacts", "plan.md"), []byte("rewritten by hand\n"), 0o644))
		}},
		{first: "$ runstate verify torn", runs: map[string]func(*testing.T, string){"torn": seq25}, edit: func(work string) {
			f, err := os.OpenFile(ledgerPath(filepath.Join(work, "torn")), os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteString(`{"seq":26,"at":"2026-11-29T07:3`) // 31 bytes, no newline
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}},
		{first: `$ sed -i '7s/"size":43/"size":44/' edited/logs/ledger.jsonl`, runs: map[string]func(*testing.T, string){"edited": seq25}},
		{first: "$ head -4 lost/logs/ledger.jsonl > l4 && cp l4 lost/logs/ledger.jsonl", runs: map[string]func(*testing.T, string){"lost": seq25}},
		{first: "$ runstate ls runs", edit: func(work string) {
			runs := filepath.Join(work, "runs")
			for _, args := range [][]string{
				{"plan", "c/deep/awaiting", "-request", "bump the API client", "build", "review"},
				{"exec", "c/deep/awaiting", "build", "--", "true"},
				{"await", "c/deep/awaiting", "review", "-reason", "read the diff"},
				{"plan", "d/failed", "-request", "nightly: vet and test", "test"},
				{"exec", "d/failed", "test", "--", "sh", "-c", "exit 3"},
				{"plan", "b/stopped", "-request", "add tests for the billing parser", "a", "b"},
				{"plan", "a/finished", "-request", "docs only: fix README typos", "fix"},
				{"exec", "a/finished", "fix", "--", "true"},
			} {
				args[1] = filepath.Join(runs, args[1])
				runCLI(t, args...)
			}
		}},
	}
	for _, b := range blocks {
		t.Run(b.first, func(t *testing.T) {
			// Not t.TempDir: the subtest's name would put quotes and a $
			// in the paths the commands print.
			work, err := os.MkdirTemp("", "runstate-readme-")
			require.NoError(t, err)
			t.Cleanup(func() { os.RemoveAll(work) })
			for name, make := range b.runs {
				make(t, filepath.Join(work, name))
			}
			if b.edit != nil {
				b.edit(work)
			}
			block := readmeBlock(t, cmdReadme, b.first)
			if b.first == "$ head -4 lost/logs/ledger.jsonl > l4 && cp l4 lost/logs/ledger.jsonl" {
				// The README goes on with the repair of the same run.
				block += readmeBlock(t, cmdReadme, "$ runstate repair -accept-loss lost")
			}
			runTranscript(t, block, work, work)
		})
	}
}

// The shell section's transcripts, in order, on one run: a pipeline's
// plan and exec lines, an effect, and a review as a stage.
func TestReadmeShellTranscripts(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the transcripts use sh")
	}
	// The transcript shows golangci-lint not found: leave out of PATH
	// the directories that hold one.
	var dirs []string
	for _, d := range filepath.SplitList(os.Getenv("PATH")) {
		if _, err := os.Stat(filepath.Join(d, "golangci-lint")); err != nil {
			dirs = append(dirs, d)
		}
	}
	t.Setenv("PATH", strings.Join(dirs, string(os.PathListSeparator)))
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("golangci-lint is installed beside sh here, and the transcript shows it not found")
	}
	work := t.TempDir()
	src := filepath.Join(work, "gopkg")
	require.NoError(t, os.CopyFS(src, os.DirFS("../testdata/gopkg")))
	for _, first := range []string{
		`$ runstate plan ../run -request "vet and test gopkg" vet test review`,
		`$ runstate effect ../run notify:PR-12 -check 'grep -q "$RUNSTATE_IDEMPOTENCY_KEY" ../outbox && echo sent' -- sh -c 'echo "$RUNSTATE_IDEMPOTENCY_KEY" >> ../outbox; echo "{\"comment\": 981}"'`,
		`$ runstate await ../run review -reason "read exec/test.stdout" -after test`,
	} {
		runTranscript(t, readmeBlock(t, cmdReadme, first), work, src)
	}
}

// jsonNames lists the JSON field names of a struct type, in order.
func jsonNames(typ reflect.Type) []string {
	var names []string
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Anonymous {
			typ := f.Type
			if typ.Kind() == reflect.Pointer {
				typ = typ.Elem()
			}
			names = append(names, jsonNames(typ)...)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// TestReadmeJSONShapes holds the -json shapes cmd/runstate/README.md lists
// to the types each command encodes.
func TestReadmeJSONShapes(t *testing.T) {
	readme, err := os.ReadFile(cmdReadme)
	require.NoError(t, err)
	text := strings.Join(strings.Fields(string(readme)), " ") // lines rejoined
	words := regexp.MustCompile(`[a-z_]+`)
	for _, c := range []struct {
		what string
		re   string // its first group holds the names, in order
		want []string
	}{
		{"status -json", "`status -json` prints the library's `runstate.Status` \\(`([^`]*)`.*? plus `(\"blocked\": bool)` and `(\"handoff\"): ", jsonNames(reflect.TypeFor[statusJSON]())},
		{"log -json", "in the ledger's own format \\(`([^`]*)`\\)", jsonNames(reflect.TypeFor[runstate.Record]())},
		{"next -json", "`next -json` prints `\\{([^}]*)\\}`", jsonNames(reflect.TypeFor[nextJSON]())},
		{"verify -json", "`verify -json` prints `\\{([^`]*)\\}`", append(append(jsonNames(reflect.TypeFor[runstate.Report]()), jsonNames(reflect.TypeFor[runstate.Problem]())...), "ok")},
		{"repair -json", "`runstate.RepairReport`: `\\{([^}]*)\\}`", jsonNames(reflect.TypeFor[runstate.RepairReport]())},
		{"metrics -json", "`metrics -json` prints `\\{([^`]*)\\}`", append(jsonNames(reflect.TypeFor[metricsJSON]())[:1], append(jsonNames(reflect.TypeFor[runMetrics]()), "total", "metrics")...)},
		{"metrics fields", "`runstate.Metrics` \\(`([^`]*)`\\)", jsonNames(reflect.TypeFor[runstate.Metrics]())},
		{"ls -json", "`-json` prints an array of `\\{([^}]*)\\}`", jsonNames(reflect.TypeFor[lsRun]())},
	} {
		m := regexp.MustCompile(c.re).FindStringSubmatch(text)
		if !assert.NotNil(t, m, "%s: cmd/runstate/README.md no longer says %s", c.what, c.re) {
			continue
		}
		listed := strings.ReplaceAll(strings.Join(m[1:], " "), "bool", "")
		assert.Equal(t, c.want, words.FindAllString(listed, -1), "%s: the fields cmd/runstate/README.md lists", c.what)
	}
}
