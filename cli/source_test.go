package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestExportWritesTheLedgerLines(t *testing.T) {
	dir := finishedRun(t)
	lines := ledgerLines(t, dir)
	res := readCLI(t, dir, "export", dir)
	require.Equal(t, 0, res.code, res.err)
	assert.Equal(t, strings.Join(lines, ""), res.out, "the exact bytes of the ledger")

	// The export is a ledger: in a directory of its own, with the
	// artifacts copied and the projections rebuilt, Verify finds nothing.
	dir2 := filepath.Join(t.TempDir(), "copy")
	require.NoError(t, os.MkdirAll(filepath.Join(dir2, "logs"), 0o755))
	require.NoError(t, os.WriteFile(ledgerPath(dir2), []byte(res.out), 0o644))
	require.NoError(t, os.CopyFS(filepath.Join(dir2, "artifacts"), os.DirFS(filepath.Join(dir, "artifacts"))))
	rep, err := runstate.Verify(dir2)
	require.NoError(t, err)
	for _, p := range rep.Problems {
		assert.NotEqual(t, ledgerPath(dir2), p.File, "the exported ledger: %s", p.What)
	}
	_, err = runstate.Repair(dir2, nil)
	require.NoError(t, err)
	rep, err = runstate.Verify(dir2)
	require.NoError(t, err)
	assert.Empty(t, rep.Problems)
	assert.Equal(t, int64(len(lines)), rep.Records)

	// A torn tail is not exported; damage stops the export at its line.
	appendTorn(t, dir)
	res = readCLI(t, dir, "export", dir)
	assert.Equal(t, 0, res.code, res.err)
	assert.Equal(t, strings.Join(lines, ""), res.out)
	off := editLine(t, dir, 4, `"stage":"inspect"`, `"stage":"INSPECT"`)
	res = readCLI(t, dir, "export", dir)
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, fmt.Sprintf("%s line 5 (byte %d): prev hash does not match line 4", ledgerPath(dir), off))
	assert.Contains(t, res.err, "4 records written before it")
	assert.Equal(t, 4, strings.Count(res.out, "\n"), "the lines before the damage")

	res = runCLI(t, "export", filepath.Join(t.TempDir(), "none"))
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "is not a run directory")
}

func TestAnAddressNeedsTheCommandForItsStore(t *testing.T) {
	for _, args := range [][]string{
		{"status", "postgres://u:secret@db:5432/agents?run=billing"},
		{"log", "-follow", "postgresql://db/agents?run=billing"},
		{"approve", "postgres://db/agents?run=billing", "execute", "-by", "x"},
	} {
		res := runCLI(t, args...)
		assert.Equal(t, 1, res.code, args)
		assert.Contains(t, res.err, "address, and this runstate command reads run directories only", args)
		assert.Contains(t, res.err, pgCommand, args)
		assert.NotContains(t, res.err, "secret", "the password is not printed")
	}
	res := runCLI(t, "status", "s3://bucket/run")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "s3://bucket/run is a s3:// address, and this runstate command reads run directories only; give a run directory")
}

func TestDirectoryCommandsRefuseAnAddress(t *testing.T) {
	for _, args := range [][]string{
		{"repair", "postgres://db/agents?run=billing"},
		{"plan", "postgres://db/agents?run=billing", "a"},
		{"exec", "postgres://db/agents?run=billing", "a", "--", "true"},
		{"ls", ".", "postgres://db/agents"},
	} {
		res := runCLI(t, args...)
		assert.Equal(t, exitUsage, res.code, args)
		assert.Contains(t, res.err, "is an address, not a run directory: "+args[0]+" works on run directories only", args)
		if args[0] != "repair" { // the command that lists a database's runs, or works on them
			assert.Contains(t, res.err, pgCommand, args)
		}
	}
}

// renamedDir is a run directory served as a Source under another name, as
// a database store would be.
type renamedDir struct {
	dirSource
	name   string
	opened *int
}

func (r *renamedDir) Name() string { return r.name }

func (r *renamedDir) Open(ctx context.Context, o *runstate.Options) (*runstate.Run, error) {
	*r.opened++
	return r.dirSource.Open(ctx, o)
}

func TestARegisteredSourceServesTheReadAndOperatorCommands(t *testing.T) {
	dir := awaitingRun(t)
	opened := 0
	o := &Options{Sources: map[string]Opener{"Mem": func(_ context.Context, addr string) (Source, error) {
		if addr != "mem://billing" {
			return nil, fmt.Errorf("no run %s", addr)
		}
		return &renamedDir{dirSource: dirSource{dir: dir}, name: addr, opened: &opened}, nil
	}}}
	run := func(args ...string) result {
		var out, errb bytes.Buffer
		code := Run(args, &out, &errb, o)
		return result{out.String(), errb.String(), code}
	}
	for _, cmd := range [][]string{{"status", "-json"}, {"log", "-json"}, {"verify", "-json"}, {"next", "-json"}, {"metrics", "-json"}, {"export"}} {
		want := readCLI(t, dir, append(cmd, dir)...)
		got := run(append(cmd, "mem://billing")...)
		assert.Equal(t, want.code, got.code, cmd)
		assert.Equal(t, strings.ReplaceAll(want.out, `"dir": "`+dir+`"`, `"dir": "mem://billing"`),
			strings.ReplaceAll(got.out, `"dir": "`+dir+`"`, `"dir": "mem://billing"`), cmd)
	}
	res := run("status", "mem://billing")
	assert.Equal(t, exitBlocked, res.code)
	assert.Contains(t, res.out, "do: runstate approve mem://billing execute -by NAME", "the advice names the address")

	res = run("approve", "mem://billing", "execute", "-by", "alice")
	assert.Equal(t, 0, res.code, res.err)
	assert.Regexp(t, `approved stage execute \(by alice\): recorded at seq \d+ in mem://billing`, res.out)
	assert.Equal(t, 1, opened, "the session was opened through the Source")
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	s, _ := st.Stage("execute")
	assert.Equal(t, runstate.StatePending, s.State, "a failure that needed a person may be begun again")

	res = run("status", "mem://other")
	assert.Equal(t, 1, res.code)
	assert.Contains(t, res.err, "runstate: no run mem://other")
}

// TestAWorkingDirectoryLeadsToItsRun: a working directory of a run kept
// elsewhere (its logs/run.json names the address, pgstore writes it) is
// read at that address by a command that has its Source, and named with
// what to do by one that has not; a run directory stays a run directory.
func TestAWorkingDirectoryLeadsToItsRun(t *testing.T) {
	run := awaitingRun(t)
	work := workDirOfBilling(t, "x")

	var out, errb bytes.Buffer
	code := Run([]string{"status", work}, &out, &errb, nil)
	assert.Equal(t, exitFail, code)
	assert.Contains(t, errb.String(), work+" is a working directory of the run at postgres://agent@db:5432/agents?run=billing")
	assert.Contains(t, errb.String(), pgCommand)

	var asked string
	o := &Options{Sources: map[string]Opener{"postgres": func(_ context.Context, addr string) (Source, error) {
		asked = addr
		return &renamedDir{dirSource: dirSource{dir: run}, name: addr, opened: new(int)}, nil
	}}}
	out.Reset()
	errb.Reset()
	code = Run([]string{"status", work}, &out, &errb, o)
	assert.Equal(t, exitBlocked, code, errb.String())
	assert.Equal(t, "postgres://agent@db:5432/agents?run=billing", asked)
	assert.Contains(t, out.String(), "do: runstate approve 'postgres://agent@db:5432/agents?run=billing' execute")

	// The commands that write a run directory refuse it: they would make
	// a second run there.
	for _, args := range [][]string{{"exec", work, "x", "--", "true"}, {"plan", work, "-request", "r", "x"}, {"repair", work}} {
		out.Reset()
		errb.Reset()
		code = Run(args, &out, &errb, nil)
		assert.Equal(t, exitUsage, code, "%v: %s", args, errb.String())
		assert.Contains(t, errb.String(), "is a working directory of the run at postgres://agent@db:5432/agents?run=billing", args)
	}
	_, err := os.Stat(filepath.Join(work, "logs", "ledger.jsonl"))
	assert.ErrorIs(t, err, os.ErrNotExist, "no run was made in the working directory")

	// logs/run.json beside a ledger: a run directory all the same.
	require.NoError(t, os.WriteFile(filepath.Join(run, "logs", "run.json"), []byte(`{"address": "postgres://x/y?run=z"}`), 0o644))
	res := readCLI(t, run, "status", run)
	assert.Equal(t, exitBlocked, res.code, res.err)
}

// export and log -follow check each line's crc, as every reader of the
// library does: a flipped bit in the last line (which no later prev
// covers), a crc field dropped or moved, are damage, not records.
func TestExportAndFollowCheckEachLinesCRC(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(last string) string // the last line, without '\n'
		want string
	}{
		{"flipped bit", func(l string) string { return strings.Replace(l, `"ev":"close"`, `"ev":"closf"`, 1) },
			"checksum "},
		{"crc dropped", func(l string) string { return l[:strings.LastIndex(l, `,"crc":"`)] + "}" },
			`no "crc" field, though the line before has one`},
		{"crc moved", func(l string) string {
			i := strings.LastIndex(l, `,"crc":"`)
			return `{"crc":"` + l[i+len(`,"crc":"`):len(l)-1] + "," + l[1:i] + "}"
		}, `the "crc" field is not the line's last`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := finishedRun(t)
			lines := ledgerLines(t, dir)
			n := len(lines)
			last := strings.TrimSuffix(lines[n-1], "\n")
			require.Contains(t, last, `"ev":"close"`)
			lines[n-1] = tc.edit(last) + "\n"
			var before int64
			for _, l := range lines[:n-1] {
				before += int64(len(l))
			}
			where := fmt.Sprintf("%s line %d (byte %d): ", ledgerPath(dir), n, before)

			// follow from the line before: the edited line comes as an append.
			require.NoError(t, os.WriteFile(ledgerPath(dir), []byte(strings.Join(lines[:n-1], "")), 0o644))
			f := follow(t, dir)
			for range n - 1 {
				f.next(t)
			}
			appendDamage(t, dir, lines[n-1])
			assert.Equal(t, exitFail, f.exit(t), "log -follow")
			assert.Contains(t, f.errb.String(), where+tc.want)
			assert.Empty(t, f.lines, "the damaged line was not shown")

			res := readCLI(t, dir, "export", dir)
			assert.Equal(t, 1, res.code, "export")
			assert.Contains(t, res.err, where+tc.want)
			assert.Equal(t, strings.Join(lines[:n-1], ""), res.out, "the lines before the damage")
		})
	}
}

// identified is a Source whose run has the id id (RunIdentifier), and
// that counts its Closes.
type identified struct {
	renamedDir
	id     string
	closed *int
}

func (s *identified) RunID(context.Context) (string, error) { return s.id, nil }

func (s *identified) Close() error {
	*s.closed++
	return s.renamedDir.Close()
}

// TestAWorkingDirectoryReadsOnlyItsOwnRun: the run at the address a
// working directory's logs/run.json names must have the id the file
// names: a run dropped and made again under its name is refused, naming
// both ids and what to do; an error of the address's store says where
// the address came from.
func TestAWorkingDirectoryReadsOnlyItsOwnRun(t *testing.T) {
	run := awaitingRun(t)
	work := workDirOfBilling(t, "01a2534f-0000-7000-8000-000000009c86")
	closed := 0
	id := "01a2534b-0000-7000-8000-00000000eeea"
	o := &Options{Sources: map[string]Opener{"postgres": func(_ context.Context, addr string) (Source, error) {
		if id == "" {
			return nil, errors.New("runstate: postgres://agent@db:5432/agents?run=billing: pgstore: cannot connect")
		}
		return &identified{renamedDir: renamedDir{dirSource: dirSource{dir: run}, name: addr, opened: new(int)}, id: id, closed: &closed}, nil
	}}}
	for _, cmd := range []string{"status", "log", "verify", "next", "metrics", "export"} {
		var out, errb bytes.Buffer
		code := Run([]string{cmd, work}, &out, &errb, o)
		assert.Equal(t, exitFail, code, cmd)
		assert.Empty(t, out.String(), cmd)
		assert.Contains(t, errb.String(), filepath.Join(work, "logs", "run.json")+" names run id 01a2534f-0000-7000-8000-000000009c86 at postgres://agent@db:5432/agents?run=billing", cmd)
		assert.Contains(t, errb.String(), "is another one (id 01a2534b-0000-7000-8000-00000000eeea)", cmd)
		assert.Contains(t, errb.String(), "runstate status 'postgres://agent@db:5432/agents?run=billing'", cmd)
	}
	assert.Equal(t, 6, closed, "each refused Source was closed")

	id = "01a2534f-0000-7000-8000-000000009c86"
	var out, errb bytes.Buffer
	code := Run([]string{"status", work}, &out, &errb, o)
	assert.Equal(t, exitBlocked, code, errb.String())

	id = "" // the opener fails
	out.Reset()
	errb.Reset()
	code = Run([]string{"status", work}, &out, &errb, o)
	assert.Equal(t, exitFail, code)
	assert.Equal(t, "runstate: "+work+" is a working directory of the run at postgres://agent@db:5432/agents?run=billing (its logs/run.json says so): postgres://agent@db:5432/agents?run=billing: pgstore: cannot connect\n", errb.String())
}

// TestADamagedWorkDirFileIsNamed: a directory with no ledger whose
// logs/run.json names no address is reported as that, not as a directory
// without a ledger; a key=value connection string given as DIR is named
// as one, without its password.
func TestADamagedWorkDirFileIsNamed(t *testing.T) {
	damaged := map[string]func(p string) error{
		"not JSON":    func(p string) error { return os.WriteFile(p, []byte("{bad json"), 0o644) },
		"empty":       func(p string) error { return os.WriteFile(p, nil, 0o644) },
		"a directory": func(p string) error { return os.Mkdir(p, 0o755) },
		"too long": func(p string) error {
			return os.WriteFile(p, []byte(`{"address": "postgres://x/y?run=z", "pad": "`+strings.Repeat("x", 70<<10)+`"}`), 0o644)
		},
	}
	for name, damage := range damaged {
		t.Run(name, func(t *testing.T) {
			work := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(work, "logs"), 0o755))
			rj := filepath.Join(work, "logs", "run.json")
			require.NoError(t, damage(rj))
			for _, cmd := range []string{"status", "log", "verify", "next"} {
				res := readCLI(t, work, cmd, work)
				assert.Equal(t, exitFail, res.code, cmd)
				assert.Contains(t, res.err, work+" has no logs/ledger.jsonl, and its logs/run.json names no run address (", cmd)
				assert.Contains(t, res.err, "give that run's address instead of "+work, cmd)
				assert.Contains(t, res.err, "restore or remove "+rj, cmd)
				assert.NotContains(t, res.err, "not a run directory", cmd)
			}
		})
	}

	for _, dsn := range []string{
		"host=db dbname=agents user=agent password=Sekr1t99 run=billing",
		"host=db password = 'Wrong Sekr1t99\\'x' dbname=agents",
		"host='db'password=Sekr1t99",
		"host=db\rpassword=Sekr1t99",
		"host=db\vpassword=Sekr1t99",
		"host=db password=ab\\ Sekr1t99",
		"dbname=postgres://u:Sekr1t99@h/db",
		"sslpassword=Sekr1t99 sslkey=/k",
		"password\v=Sekr1t99",
		"connect_timeout=5 password\v=Sekr1t99",
		"password=Sekr1t99 junk",
		"dbname='postgres://u:Sekr1t99@h/db'",
	} {
		for _, args := range [][]string{{"status", dsn}, {"verify", dsn}, {"ls", dsn}, {"repair", dsn}, {"exec", dsn, "s", "--", "true"}, {"plan", dsn, "-request", "r", "s"}} {
			cwd := t.TempDir()
			cmd := exec.Command(bin, args...)
			cmd.Dir = cwd
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			res := resultOf(t, cmd.Run(), &out, &errb)
			assert.NotEqual(t, 0, res.code, "%q", args)
			assert.Contains(t, res.err, "the DIR given is a key=value connection string (not shown: it may hold a password), which runstate does not take: give a run address, postgres://USER@HOST:PORT/DB?run=NAME", "%q", args)
			assert.NotContains(t, res.err+res.out, "Sekr1t99", "%q", args)
			entries, err := os.ReadDir(cwd)
			require.NoError(t, err)
			assert.Empty(t, entries, "%q: nothing made", args)
		}
	}

	// A directory to make whose name has an '=' (a partition's, a
	// setting's) is not one: plan makes it.
	for _, dir := range []string{"host=a", "run=7", "host=web1/2024", "runs/job 1 user=bob", "it's user=x", "runs/host=a"} {
		cwd := t.TempDir()
		cmd := exec.Command(bin, "plan", dir, "-request", "r", "s")
		cmd.Dir = cwd
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		res := resultOf(t, cmd.Run(), &out, &errb)
		assert.Equal(t, 0, res.code, "%q: %s", dir, res.err)
		_, err := os.Stat(filepath.Join(cwd, dir, "logs", "ledger.jsonl"))
		assert.NoError(t, err, "%q: the run was made", dir)
	}
}

// The command that reads directories only does not offer -at for a
// directory that holds no run: it has no store that -at could name.
func TestExecOnANewDirectoryOffersNoAtWithoutAStore(t *testing.T) {
	w := filepath.Join(t.TempDir(), "w")
	res := runCLI(t, "exec", w, "build", "--", "true")
	assert.Equal(t, exitUsage, res.code, res.err)
	assert.Contains(t, res.err, "give -request TEXT to create one\n")
	assert.NotContains(t, res.err, "give -at")
}

// workDirOfBilling is a working directory whose logs/run.json names the
// run billing at postgres://agent@db:5432/agents, with id.
func workDirOfBilling(t *testing.T, id string) string {
	t.Helper()
	work := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(work, "logs"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(work, "logs", "run.json"),
		[]byte(`{"store": "postgres", "address": "postgres://agent@db:5432/agents?run=billing", "schema": "runstate", "run": "billing", "id": "`+id+`"}`+"\n"), 0o644))
	return work
}
