package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/examples/agent/tickets"
)

// Crash points of the ticket's side effect (-crash-at).
const (
	crashBeforePost = "before-post" // intent durable, nothing sent
	crashAfterPost  = "after-post"  // the service filed it, no confirm recorded
)

type config struct {
	dir, src           string
	ticketd, ticketsDB string
	approveAs          string
	crashAt, crashHow  string
	out                io.Writer
}

// agent is one session of the example agent on a run.
type agent struct {
	cfg     config
	run     *runstate.Run
	tickets *tickets.Client
	work    string // the edited copy of the package, relative to the run dir
}

// The artifacts the stages write, relative to the run directory.
const (
	inspectJSON = "artifacts/inspect.json"
	planJSON    = "artifacts/plan.json"
	planMD      = "artifacts/plan.md"
	verifyTXT   = "artifacts/verify.txt"
	reviewMD    = "artifacts/review.md"
	ticketJSON  = "artifacts/ticket.json"
)

func run(ctx context.Context, cfg config) error {
	src := filepath.Clean(cfg.src)
	files, err := os.ReadDir(src)
	if err != nil {
		return fmt.Errorf("the package to work on: %w (run from the repository root, or pass -src)", err)
	}
	var srcFiles []string
	for _, f := range files {
		if f.Type().IsRegular() {
			srcFiles = append(srcFiles, f.Name())
		}
	}
	rev, err := revision(src, srcFiles)
	if err != nil {
		return err
	}
	r, err := runstate.Open(cfg.dir, &runstate.Options{
		Request:     "add doc comments to the exported declarations of the Go package in " + filepath.ToSlash(src),
		Revision:    rev,
		Environment: map[string]string{"go": runtime.Version(), "os": runtime.GOOS},
		Flow:        runstate.AgentFlow(),
	})
	if err != nil {
		return err
	}
	defer r.Close()
	cfg.src = src

	client, stop, err := ticketService(cfg)
	if err != nil {
		return err
	}
	defer stop()
	a := &agent{cfg: cfg, run: r, tickets: client, work: "work/" + filepath.Base(absOr(src))}
	fmt.Fprintf(cfg.out, "run %s in %s (session %s)\n", r.ID(), cfg.dir, r.Session())
	fmt.Fprintf(cfg.out, "ticket service: %s\n", client.URL)
	err = a.pipeline(ctx, srcFiles)
	if errors.Is(err, errWaiting) {
		return nil
	}
	if err != nil {
		a.blockers()
		return err
	}
	if err := r.Close(); err != nil {
		return err
	}
	// The metrics as the ledger has them, this session's close included.
	st, err := runstate.Inspect(cfg.dir)
	if err != nil {
		return err
	}
	m := st.Metrics
	fmt.Fprintf(cfg.out, "\ndone: %d of %d planned stages complete.\n", st.Done, st.Done+st.Remaining)
	fmt.Fprintf(cfg.out, "metrics: sessions %d (resumed %d, interrupted stages %d), stages skipped on resume %d, redone with unchanged evidence %d;\n",
		m.Sessions, m.ResumedSessions, m.Interrupted, m.SkippedOnResume, m.DuplicatedWork)
	fmt.Fprintf(cfg.out, "         effects deduplicated %d, sent more than once %d, unconfirmed %d\n",
		m.EffectsDeduplicated, m.EffectsDuplicated, m.EffectsUnconfirmed)
	fmt.Fprintf(cfg.out, "handoff: %s\n", filepath.Join(cfg.dir, "logs", "next-steps.txt"))
	return nil
}

// errWaiting stops the pipeline at the review: not an error.
var errWaiting = errors.New("waiting for a person")

func (a *agent) pipeline(ctx context.Context, srcFiles []string) error {
	r := a.run
	if st, err := r.Status(); err != nil {
		return err
	} else if len(st.Plan) == 0 {
		// What exists before the plan says which files need work.
		if err := r.Plan(ctx, "inspect", "plan", "verify", "await-review", "complete"); err != nil {
			return err
		}
	}
	var srcInputs []runstate.Input
	for _, f := range srcFiles {
		srcInputs = append(srcInputs, runstate.File(filepath.Join(a.cfg.src, f)))
	}

	if err := a.do(ctx, "inspect", a.inspect, srcInputs...); err != nil {
		return err
	}
	if err := a.do(ctx, "plan", a.plan, runstate.After("inspect")); err != nil {
		return err
	}
	var plan []finding
	if err := readJSON(filepath.Join(r.Dir(), planJSON), &plan); err != nil {
		return err
	}
	byFile := map[string][]finding{}
	var execStages []string
	for _, f := range plan {
		if byFile[f.File] == nil {
			execStages = append(execStages, "execute/"+f.File)
		}
		byFile[f.File] = append(byFile[f.File], f)
	}
	stages := append([]string{"inspect", "plan"}, execStages...)
	if len(execStages) == 0 {
		stages = append(stages, "execute")
	}
	if err := r.Plan(ctx, append(stages, "verify", "await-review", "complete")...); err != nil {
		return err
	}
	if len(execStages) == 0 {
		// Nothing to edit: the flow still goes through execute.
		if err := r.Skip(ctx, "execute", "every exported declaration has a doc comment"); err != nil {
			return err
		}
	}

	verifyInputs := append([]runstate.Input{runstate.After("plan")}, srcInputs...)
	for _, name := range execStages {
		file := strings.TrimPrefix(name, "execute/")
		fs := byFile[file]
		err := a.do(ctx, name, func(ctx context.Context, st *runstate.Stage) error {
			return a.execute(st, file, fs)
		}, runstate.After("plan"), runstate.File(filepath.Join(a.cfg.src, file)))
		if err != nil {
			return err
		}
		verifyInputs = append(verifyInputs, runstate.After(name))
	}
	if err := a.do(ctx, "verify", func(ctx context.Context, st *runstate.Stage) error {
		return a.verify(ctx, st, srcFiles)
	}, verifyInputs...); err != nil {
		return err
	}

	err := a.do(ctx, "await-review", func(ctx context.Context, st *runstate.Stage) error {
		return a.review(st, plan)
	}, runstate.After("verify"))
	if errors.Is(err, runstate.ErrNeedsPerson) {
		if a.cfg.approveAs == "" {
			fmt.Fprintf(a.cfg.out, "\nwaiting for a person to review %s and %s/ (diff -ru %s %s).\n",
				filepath.Join(r.Dir(), reviewMD), filepath.Join(r.Dir(), a.work), a.cfg.src, filepath.Join(r.Dir(), a.work))
			fmt.Fprintf(a.cfg.out, "approve, then run the agent again:\n\n    go run ./cmd/runstate approve %s await-review -by NAME -note TEXT\n\n", r.Dir())
			return errWaiting
		}
		if err := r.Approve(ctx, "await-review", a.cfg.approveAs, "approved with the example's -approve-as flag"); err != nil {
			return err
		}
		fmt.Fprintf(a.cfg.out, "%-22s approved by %s (-approve-as)\n", "await-review", a.cfg.approveAs)
		err = nil
	}
	if err != nil {
		return err
	}

	return a.do(ctx, "complete", a.complete, runstate.After("await-review"))
}

// do runs one stage with runstate.Do and says whether it ran or was
// already complete.
func (a *agent) do(ctx context.Context, name string, fn func(context.Context, *runstate.Stage) error, inputs ...runstate.Input) error {
	ran := false
	start := time.Now()
	err := a.run.Do(ctx, name, func(ctx context.Context, st *runstate.Stage) error {
		ran = true
		return fn(ctx, st)
	}, inputs...)
	switch {
	case errors.Is(err, runstate.ErrNeedsPerson):
		fmt.Fprintf(a.cfg.out, "%-22s needs a person: %v\n", name, err)
	case err != nil:
		fmt.Fprintf(a.cfg.out, "%-22s failed: %v\n", name, err)
	case ran:
		fmt.Fprintf(a.cfg.out, "%-22s done (%s)\n", name, time.Since(start).Round(time.Millisecond))
	default:
		fmt.Fprintf(a.cfg.out, "%-22s already complete, evidence holds: skipped\n", name)
	}
	return err
}

// inspect finds the exported declarations without a doc comment.
func (a *agent) inspect(_ context.Context, st *runstate.Stage) error {
	files, err := goFiles(a.cfg.src)
	if err != nil {
		return err
	}
	found := []finding{}
	for _, f := range files {
		fs, err := undocumented(a.cfg.src, f)
		if err != nil {
			return runstate.NeedsPerson(err, "the package does not parse: fix it, then approve inspect")
		}
		found = append(found, fs...)
	}
	return writeJSON(st, inspectJSON, found)
}

// plan decides the comment for each finding, one execute stage per file.
func (a *agent) plan(_ context.Context, st *runstate.Stage) error {
	var found []finding
	if err := readJSON(filepath.Join(a.run.Dir(), inspectJSON), &found); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Plan: doc comments for %s\n\n", a.cfg.src)
	if len(found) == 0 {
		b.WriteString("Every exported declaration has a doc comment: nothing to do.\n")
	}
	file := ""
	for _, f := range found {
		if f.File != file {
			if file != "" {
				b.WriteString("\n")
			}
			file = f.File
			fmt.Fprintf(&b, "## execute/%s\n\n", file)
		}
		fmt.Fprintf(&b, "- line %d, %s %s: `// %s`\n", f.Line, f.Kind, f.Name, f.Comment)
	}
	if err := st.WriteFile(planMD, []byte(b.String())); err != nil {
		return err
	}
	return writeJSON(st, planJSON, found)
}

// execute writes the edited copy of one file.
func (a *agent) execute(st *runstate.Stage, file string, fs []finding) error {
	src, err := os.ReadFile(filepath.Join(a.cfg.src, file))
	if err != nil {
		return err
	}
	out, err := addComments(src, fs)
	if err != nil {
		return runstate.NeedsPerson(err, "the edit does not apply: invalidate plan to plan again")
	}
	return st.WriteFile(a.work+"/"+file, out)
}

// verify runs go vet and go test on the package with the edits, in a
// scratch copy, and records their output.
func (a *agent) verify(ctx context.Context, st *runstate.Stage, srcFiles []string) error {
	tmp, err := os.MkdirTemp("", "agent-verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, f := range srcFiles {
		data, err := os.ReadFile(filepath.Join(a.run.Dir(), a.work, f))
		if errors.Is(err, os.ErrNotExist) {
			data, err = os.ReadFile(filepath.Join(a.cfg.src, f)) // not edited
		}
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(tmp, f), data, 0o644); err != nil {
			return err
		}
	}
	var out bytes.Buffer
	failed := false
	for _, args := range [][]string{{"vet", "./..."}, {"test", "./..."}} {
		fmt.Fprintf(&out, "$ go %s\n", strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if err != nil {
			fmt.Fprintf(&out, "-> FAILED: %v\n\n", err)
			failed = true
			continue
		}
		out.WriteString("-> exit status 0\n\n")
	}
	if err := st.WriteFile(verifyTXT, out.Bytes()); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if failed {
		return runstate.NeedsPerson(errors.New("go vet or go test failed on the edited package"),
			"read "+verifyTXT+", fix the cause, then approve verify")
	}
	return nil
}

// review writes what a person needs to review and waits for them.
func (a *agent) review(st *runstate.Stage, plan []finding) error {
	verify, err := os.ReadFile(filepath.Join(a.run.Dir(), verifyTXT))
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Review: doc comments for %s\n\n", a.cfg.src)
	fmt.Fprintf(&b, "%d doc comments added; the edited copy is in %s/ (the source is unchanged).\n", len(plan), a.work)
	fmt.Fprintf(&b, "See the change with: diff -ru %s %s\n\n", a.cfg.src, filepath.Join(a.run.Dir(), a.work))
	for _, f := range plan {
		fmt.Fprintf(&b, "- %s:%d %s: // %s\n", f.File, f.Line, f.Name, f.Comment)
	}
	fmt.Fprintf(&b, "\n## verify (%s)\n\n```\n%s```\n", verifyTXT, verify)
	if err := st.WriteFile(reviewMD, []byte(b.String())); err != nil {
		return err
	}
	return st.Await("review " + reviewMD + " and " + a.work + "/, then approve")
}

// complete files the ticket that reports the reviewed change: a side
// effect that must happen once, whatever happens to this process.
func (a *agent) complete(ctx context.Context, st *runstate.Stage) error {
	review, err := os.ReadFile(filepath.Join(a.run.Dir(), reviewMD))
	if err != nil {
		return err
	}
	status, err := a.run.Status()
	if err != nil {
		return err
	}
	reviewed, _ := status.Stage("await-review")
	req := tickets.NewTicket{
		Title: "gopkg: doc comments added, reviewed " + strings.TrimPrefix(reviewed.Reason, "approved "),
		Body:  string(review),
	}
	// One ticket per reviewed change: the key is derived from the request,
	// so a redone review with other content files a new ticket, and the
	// same one never files two.
	canon, _ := json.Marshal(req)
	sum := sha256.Sum256(canon)
	key := "ticket:review-" + hex.EncodeToString(sum[:6])

	before := runstate.EffectStatus{}
	for _, e := range status.Effects {
		if e.Key == key {
			before = e
		}
	}
	sent := false
	receipt, err := a.run.Effect(ctx, key, runstate.Effect{
		Request: req,
		Do: func(ctx context.Context, fullKey string) (json.RawMessage, error) {
			a.crash(crashBeforePost)
			sent = true
			receipt, err := a.tickets.Create(ctx, fullKey, req)
			if errors.Is(err, tickets.ErrAccepted) {
				return nil, fmt.Errorf("%w: %w", runstate.ErrPending, err)
			}
			if err != nil {
				return nil, err
			}
			a.crash(crashAfterPost)
			return receipt, nil
		},
		Check: func(ctx context.Context, fullKey string) (json.RawMessage, bool, error) {
			return a.tickets.Lookup(ctx, fullKey)
		},
	})
	if errors.Is(err, runstate.ErrPending) {
		return fmt.Errorf("the ticket service accepted the ticket but has not filed it yet; run the agent again later: %w", err)
	}
	if err != nil {
		return err
	}
	var t tickets.Ticket
	_ = json.Unmarshal(receipt, &t)
	how := "filed"
	switch {
	case sent && before.Intents > 0:
		how = "filed (an earlier attempt had not reached the service)"
	case !sent && before.State == runstate.EffectConfirmed:
		how = "already filed: receipt from the ledger"
	case !sent && before.Pending:
		how = "filed: the service accepted it earlier and has filed it now (confirmed by asking it)"
	case !sent:
		how = "already filed by an earlier session that died before recording it: confirmed by asking the service, not filed again"
	}
	fmt.Fprintf(a.cfg.out, "%-22s ticket %s %s\n", "", t.ID, how)
	return st.WriteFile(ticketJSON, append(receipt, '\n'))
}

// crash ends the process at point when -crash-at names it: no Close, no
// confirm, exactly what a kill leaves behind.
func (a *agent) crash(point string) {
	if a.cfg.crashAt != point {
		return
	}
	fmt.Fprintf(a.cfg.out, "crash point %s reached (pid %d)\n", point, os.Getpid())
	if a.cfg.crashHow == "hang" {
		fmt.Fprintf(a.cfg.out, "hanging here: kill -9 %d, then run the agent again\n", os.Getpid())
		for {
			time.Sleep(time.Hour)
		}
	}
	os.Exit(3)
}

// blockers prints what keeps the run from going on by itself.
func (a *agent) blockers() {
	st, err := a.run.Status()
	if err != nil || len(st.Blockers) == 0 {
		return
	}
	fmt.Fprintln(a.cfg.out, "\nblockers:")
	for _, b := range st.Blockers {
		what := b.Stage
		if what == "" {
			what = "effect " + b.Key
		}
		fmt.Fprintf(a.cfg.out, "  %s %s: %s\n    do: %s\n", what, b.Kind, b.Reason, b.Action)
	}
}

// ticketService returns a client for the ticket service: the one at
// -ticketd, or one started in-process on 127.0.0.1.
func ticketService(cfg config) (*tickets.Client, func(), error) {
	if cfg.ticketd != "" {
		return &tickets.Client{URL: strings.TrimSuffix(cfg.ticketd, "/")}, func() {}, nil
	}
	db := cfg.ticketsDB
	if db == "" {
		db = filepath.Join(cfg.dir, "ticketd", "tickets.json")
	}
	srv, err := tickets.NewServer(db)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return &tickets.Client{URL: "http://" + ln.Addr().String()}, func() { _ = hs.Close() }, nil
}

// revision fingerprints the package's files: the run records it with each
// session, as it would a git commit.
func revision(dir string, files []string) (string, error) {
	h := sha256.New()
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", f, len(data))
		h.Write(data)
	}
	return "src-" + hex.EncodeToString(h.Sum(nil))[:12], nil
}

func absOr(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

func writeJSON(st *runstate.Stage, path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return st.WriteFile(path, append(data, '\n'))
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}
