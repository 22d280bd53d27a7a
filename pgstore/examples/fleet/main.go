// Command fleet is a run shared by several machines, on PostgreSQL: three
// worker processes, each with a working directory of its own as a machine
// has, share one run of eight shards and a report. One machine dies in the
// middle of a stage (this program kills it); the others see its stage busy
// while its session lives, take it over once the session is gone, and the
// report, on whichever machine gets to it, reads the shards' outputs that
// the other machines made, from the database.
//
//	cd pgstore && ./testdb.sh go run ./examples/fleet       # on a throwaway server
//	go run ./examples/fleet -dsn postgres://user@host/db    # on yours (schema runstate)
//
// It prints what each machine does, then the run as the database holds it
// (each stage's attempts and the machine that completed it) and the result
// of Verify, and the command that shows the run afterwards. It exits 1 when
// a stage is not complete or the run does not verify.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/pgstore"
)

// Text is what the fleet counts the words of, a shard (a line) per stage.
const Text = `A run directory serves one machine, and its lock is a file lock.
A fleet of agents on several machines needs the run somewhere they all reach.
PostgreSQL is that place for many teams, the database they already run.
Every record is the same line as in a ledger file, with its hash chain.
A session that dies is seen gone within milliseconds, by its advisory lock.
Its stage shows busy until then, and interrupted after, for another to redo.
An output made on one machine is stored in the database with its record,
so a stage on another machine that depends on it finds the same bytes.`

// Request is the run's identity: every machine opens the run with it.
const Request = "count the words of the fleet example's text, a shard per line"

func shards() []string {
	var names []string
	for i := range strings.Split(Text, "\n") {
		names = append(names, fmt.Sprintf("shard-%d", i+1))
	}
	return names
}

func main() {
	dsn := flag.String("dsn", os.Getenv("RUNSTATE_PG_DSN"), "the PostgreSQL server (a URL or key=value DSN; schema=NAME picks the schema, default runstate); default $RUNSTATE_PG_DSN")
	name := flag.String("run", "fleet-"+time.Now().UTC().Format("20060102-150405"), "the run's name")
	dir := flag.String("dir", "", "where the machines' working directories go (default: a new temporary directory)")
	machines := flag.Int("machines", 3, "worker processes; the last one is killed in the middle of its first stage (at least 2)")
	worker := flag.String("worker", "", "(internal) work as this machine: a child process of this program")
	doomed := flag.Bool("doomed", false, "(internal) the worker hangs in its first stage until killed")
	first := flag.Int("first", 0, "(internal) the worker tries the shards from this one (0-based) on, so that the machines start apart")
	flag.Parse()
	if *dsn == "" {
		fmt.Fprintln(os.Stderr, "fleet: no server: pass -dsn postgres://user@host/db, or set RUNSTATE_PG_DSN (cd pgstore && ./testdb.sh go run ./examples/fleet starts a throwaway one)")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	if *worker != "" {
		err = work(ctx, *dsn, *name, *dir, *worker, *doomed, *first, os.Stdout)
	} else {
		err = lead(ctx, *dsn, *name, *dir, *machines, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// work is one machine: it opens the run in its own working directory and
// takes every shard it can, from the first'th on, until the report is
// complete.
func work(ctx context.Context, dsn, name, dir, machine string, doomed bool, first int, out io.Writer) error {
	db, err := pgstore.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	run, err := db.Open(ctx, name, dir, &runstate.Options{Request: Request, Environment: map[string]string{"machine": machine}})
	if err != nil {
		return err
	}
	defer run.Close()
	fmt.Fprintf(out, "session %s\n", run.Session())
	names := shards()
	if err := run.Plan(ctx, append(names, "report")...); err != nil { // the same list from every machine: recorded once
		return err
	}
	lines := strings.Split(Text, "\n")
	busy := map[string]bool{}
	for {
		if err := run.Refresh(ctx); err != nil { // what the other machines recorded
			return err
		}
		st, err := run.Status()
		if err != nil {
			return err
		}
		if s, _ := st.Stage("report"); s.State == runstate.StateComplete {
			return nil
		}
		waiting := false
		for j := range names {
			i := (first + j) % len(names)
			shard := names[i]
			if s, _ := st.Stage(shard); s.State == runstate.StateComplete {
				continue
			}
			err := run.Do(ctx, shard, func(ctx context.Context, st *runstate.Stage) error {
				if doomed {
					fmt.Fprintf(out, "%s: working (this machine dies now)\n", shard)
					<-ctx.Done() // until killed
					return ctx.Err()
				}
				time.Sleep(200 * time.Millisecond) // the work of a stage: long enough for the others to see it busy, and to start before one machine took every shard
				n := len(strings.Fields(lines[i]))
				fmt.Fprintf(out, "%s: %d words\n", shard, n)
				return st.WriteFile("shards/"+shard+".txt", fmt.Appendf(nil, "%d words, counted on %s\n", n, machine))
			})
			switch {
			case errors.Is(err, runstate.ErrBusy):
				if !busy[shard] {
					fmt.Fprintf(out, "%s: busy, running in another live session; taking the others\n", shard)
					busy[shard] = true
				}
				waiting = true
			case err != nil:
				return err
			}
		}
		if !waiting {
			inputs := make([]runstate.Input, len(names))
			for i, shard := range names {
				inputs[i] = runstate.After(shard) // materialized in this machine's directory, wherever it was made
			}
			err := run.Do(ctx, "report", func(ctx context.Context, st *runstate.Stage) error {
				var b strings.Builder
				total, elsewhere := 0, 0
				for _, shard := range names {
					data, err := os.ReadFile(filepath.Join(run.Dir(), "shards", shard+".txt"))
					if err != nil {
						return err
					}
					var n int
					if _, err := fmt.Sscanf(string(data), "%d words", &n); err != nil {
						return fmt.Errorf("%s's output %q: %w", shard, data, err)
					}
					total += n
					if !strings.HasSuffix(string(data), " on "+machine+"\n") {
						elsewhere++
					}
					fmt.Fprintf(&b, "%s: %s", shard, data)
				}
				fmt.Fprintf(&b, "total: %d words\n", total)
				fmt.Fprintf(out, "report: %d words in %d shards (%d of them counted on other machines, their outputs fetched from the database into this machine's directory)\n",
					total, len(names), elsewhere)
				return st.WriteFile("report.txt", []byte(b.String()))
			}, inputs...)
			if err != nil && !errors.Is(err, runstate.ErrBusy) {
				return err
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lead starts the machines, kills the last one in the middle of its
// first stage, waits for the others and reports what the database holds.
func lead(ctx context.Context, dsn, name, dir string, machines int, out io.Writer) error {
	if machines < 2 {
		return fmt.Errorf("-machines %d: at least 2 (the last one is killed)", machines)
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "runstate-fleet-")
		if err != nil {
			return err
		}
		dir = d
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	db, err := pgstore.Connect(ctx, dsn) // creates the schema when it is missing
	if err != nil {
		return err
	}
	defer db.Close()
	if st, err := db.Inspect(ctx, name); err == nil && st.Done > 0 {
		return fmt.Errorf("run %s exists already, with %d stages done: pass -run with another name", name, st.Done)
	} else if err != nil && !errors.Is(err, pgstore.ErrNoRun) {
		return err
	}
	fmt.Fprintf(out, "run %s: %d shards and a report, %d machines (processes), their working directories in %s\n",
		name, len(shards()), machines, dir)

	var mu sync.Mutex // out, sessions
	sessions := map[string]string{}
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format, args...)
	}
	busy := make(chan struct{}, machines)
	start := func(machine string, doomed bool, first int) (*exec.Cmd, <-chan struct{}, <-chan error, error) {
		args := []string{"-dsn", dsn, "-run", name, "-dir", filepath.Join(dir, machine), "-worker", machine, "-first", fmt.Sprint(first)}
		if doomed {
			args = append(args, "-doomed")
		}
		cmd := exec.CommandContext(ctx, self, args...)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, nil, err
		}
		working := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				line := sc.Text()
				if s, ok := strings.CutPrefix(line, "session "); ok {
					mu.Lock()
					sessions[s] = machine
					mu.Unlock()
				}
				say("%s: %s\n", machine, line)
				switch {
				case strings.HasSuffix(line, "(this machine dies now)"):
					close(working)
				case strings.Contains(line, ": busy,"):
					select {
					case busy <- struct{}{}:
					default:
					}
				}
			}
			done <- cmd.Wait()
		}()
		return cmd, working, done, nil
	}

	// The doomed machine goes first, so that it holds a stage when the others start.
	last := fmt.Sprintf("m%d", machines)
	doomed, working, doomedDone, err := start(last, true, 0)
	if err != nil {
		return err
	}
	select {
	case <-working:
	case err := <-doomedDone:
		return fmt.Errorf("%s ended before its first stage: %v", last, err)
	case <-ctx.Done():
		return ctx.Err()
	}
	var dones []<-chan error
	for i := 1; i < machines; i++ {
		_, _, done, err := start(fmt.Sprintf("m%d", i), false, (i-1)*len(shards())/(machines-1))
		if err != nil {
			return err
		}
		dones = append(dones, done)
	}
	select { // the others have seen its stage busy: now the machine dies
	case <-busy:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := doomed.Process.Kill(); err != nil { // SIGKILL where there are signals
		return err
	}
	<-doomedDone
	say("fleet: killed %s (pid %d) in the middle of its stage\n", last, doomed.Process.Pid)
	for i, done := range dones {
		if err := <-done; err != nil {
			return fmt.Errorf("m%d: %w", i+1, err)
		}
	}

	st, err := db.Inspect(ctx, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nthe run as the database holds it (seq %d):\n", st.Seq)
	fmt.Fprintf(out, "  %-8s  %-8s  %-8s  %s\n", "stage", "state", "attempts", "done on")
	incomplete := 0
	for _, s := range st.Stages {
		note := ""
		if s.Attempt > 1 {
			note = fmt.Sprintf("  (%d attempts: %s was killed in the first)", s.Attempt, last)
		}
		fmt.Fprintf(out, "  %-8s  %-8s  %-8d  %s%s\n", s.Name, s.State, s.Attempt, sessions[s.Session], note)
		if s.State != runstate.StateComplete {
			incomplete++
		}
	}
	rep, err := db.Verify(ctx, name)
	if err != nil {
		return err
	}
	if rep.OK() {
		fmt.Fprintf(out, "verify: ok, %d records, the hash chain intact, every output's bytes in the database\n", rep.Records)
	} else {
		for _, p := range rep.Problems {
			fmt.Fprintf(out, "verify: %+v\n", p)
		}
	}
	fmt.Fprintf(out, "look at it: runstate status '%s' (the command: cd pgstore && go build -o runstate ./cmd/runstate), while the server runs\n", st.Address)
	fmt.Fprintf(out, "the machines' working directories are kept in %s (each one's logs/run.json names the run: remove them when done)\n", dir)
	switch {
	case incomplete > 0:
		return fmt.Errorf("%d stages are not complete", incomplete)
	case !rep.OK():
		return fmt.Errorf("the run does not verify")
	}
	return nil
}
