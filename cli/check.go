package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"path/filepath"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

var verifyCmd = &command{
	name:     "verify",
	synopsis: "[-json] [-blobs] DIR",
	short:    "check everything: hash chain, torn tail, artifacts, projections",
	long: `Verify checks the whole run in DIR without trusting any snapshot: every
ledger line (JSON, seq without gaps, the prev hash chain), a torn last line,
every artifact of a done stage against its recorded SHA-256 and size, and
whether manifest.json and logs/next-steps.txt reflect the ledger. It takes no
lock and writes nothing.

Each problem names the file, and for the ledger the line and byte offset,
and says what to do. Exit status 0 only when everything holds, 1 otherwise.
While a session is writing, the projections may lag the ledger by a few
records: verify says so (run it again once the session has closed).

A run kept in a store that holds outputs' bytes (a PostgreSQL run) is
checked there: its records, and every output's bytes present and whole.
With -blobs verify also reads those bytes back and rehashes them (one read
of every distinct output: its cost grows with the bytes stored); a run
directory's artifacts are rehashed always.

Each fix that names a command names the run as it was typed here. With -json
it prints one JSON object: {"dir", "address", "records", "bytes",
"problems": [{"file", "line", "offset", "what", "fix"}], "ok"}; records and
bytes count the ledger that checked out; the fixes name the run by its
address (a directory's absolute path).`,
	min: 1, max: 1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		asJSON := fs.Bool("json", false, "print JSON")
		blobs := fs.Bool("blobs", false, "also reread and rehash every output's stored bytes (a store that keeps them)")
		return func(c *cli, args []string) int {
			return c.onSource(args[0], func(ctx context.Context, src Source) int { return c.verify(ctx, src, *asJSON, *blobs) })
		}
	},
}

// BlobVerifier is a Source whose store keeps outputs' bytes (pgstore's
// blobs): 'verify -blobs' calls VerifyBlobs, which is Verify that also
// reads every output's stored bytes back and rehashes them. A Source
// without it (a run directory, whose Verify rehashes its artifacts
// always) is verified by Verify.
type BlobVerifier interface {
	VerifyBlobs(ctx context.Context) (*runstate.Report, error)
}

type verifyJSON struct {
	*runstate.Report
	OK bool `json:"ok"`
}

func (c *cli) verify(ctx context.Context, src Source, asJSON, blobs bool) int {
	dir := src.Name()
	checks := src.VerifyChecks()
	var rep *runstate.Report
	var err error
	if bv, ok := src.(BlobVerifier); ok && blobs {
		rep, err = bv.VerifyBlobs(ctx)
		checks += ", every output's stored bytes rehashed"
	} else {
		rep, err = src.Verify(ctx)
	}
	if err != nil {
		return c.fail(err)
	}
	code := exitOK
	if !rep.OK() {
		code = exitFail
	}
	if asJSON {
		if err := writeJSON(c.out, verifyJSON{Report: rep, OK: rep.OK()}); err != nil {
			return c.fail(err)
		}
		return code
	}
	w := bufio.NewWriter(c.out)
	defer w.Flush()
	if rep.OK() {
		fmt.Fprintf(w, "ok: %s: %d records (%d bytes) check out, %s\n",
			escape.Text(dir), rep.Records, rep.Bytes, checks)
		return code
	}
	for _, p := range rep.Problems {
		where := p.File
		if p.Line > 0 {
			where += fmt.Sprintf(" line %d (byte %d)", p.Line, p.Offset)
		}
		fmt.Fprintf(w, "problem: %s: %s\n", escape.Page(where), escape.Page(p.What))
		if p.Fix != "" {
			fmt.Fprintf(w, "    fix: %s\n", escape.Page(asTyped(p.Fix, rep.Address, dir)))
		}
	}
	fmt.Fprintf(w, "FAILED: %s: %d problem(s); %d ledger records (%d bytes) check out\n", escape.Text(dir), len(rep.Problems), rep.Records, rep.Bytes)
	return code
}

var nextCmd = &command{
	name:     "next",
	synopsis: "[-json] DIR",
	short:    "the handoff a fresh session reads first",
	long: `Next prints the handoff of the run in DIR: logs/next-steps.txt when it
reflects the ledger, or, when that file is behind the ledger or missing, the
same text rebuilt in memory from the ledger (a note on standard error says
so). A stage the handoff shows running, or a side effect's intent, in a
session that is gone (status counts it as a blocker) is noted on standard
error. It takes no lock and writes nothing. The handoff escapes every text
from the records (\x1b, \u202e, \\); a file that another program wrote is
escaped here too.

With -json it prints one JSON object: {"dir", "seq" (the ledger's),
"file_seq" (the file's; 0 when unreadable), "rebuilt" (bool), "text"}.`,
	min: 1, max: 1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		asJSON := fs.Bool("json", false, "print JSON")
		return func(c *cli, args []string) int {
			return c.onSource(args[0], func(ctx context.Context, src Source) int { return c.next(ctx, src, *asJSON) })
		}
	},
}

type nextJSON struct {
	Dir     string `json:"dir"`
	Seq     int64  `json:"seq"`
	FileSeq int64  `json:"file_seq"`
	Rebuilt bool   `json:"rebuilt"`
	Text    string `json:"text"`
}

func (c *cli) next(ctx context.Context, src Source, asJSON bool) int {
	dir := src.Name()
	data, p, ferr := src.Handoff(ctx)
	var fileSeq int64
	if ferr == nil {
		fileSeq, ferr = handoffSeq(data)
	}
	st, err := src.Inspect(ctx)
	if err != nil {
		return c.fail(err)
	}
	out := nextJSON{Dir: dir, Seq: st.Seq, FileSeq: fileSeq, Text: data}
	if ferr != nil || fileSeq != st.Seq {
		text, err := src.NextSteps(ctx)
		if err != nil {
			return c.fail(err)
		}
		out.Text, out.Rebuilt = text, true
		if seq, err := handoffSeq(text); err == nil {
			out.Seq = seq
		}
		why := fmt.Sprintf("does not match the ledger (it reflects seq %d, the ledger is at seq %d)", fileSeq, out.Seq)
		switch {
		case errors.Is(ferr, fs.ErrNotExist):
			why = "is missing"
		case ferr != nil:
			why = fmt.Sprintf("does not match the ledger (%v)", ferr)
		}
		fmt.Fprintf(c.err, "runstate: %s %s: showing the handoff rebuilt from the ledger\n", escape.Text(p), escape.Page(why))
	}
	// The handoff tells what the ledger says: a stage running, or an
	// effect's intent, in a session that is gone reads as if that session
	// were at work. status counts them as blockers; say so here too.
	alive := sessionsAlive(ctx, src, st)
	for _, s := range st.Stages {
		if s.State == runstate.StateRunning && !alive[s.Session] {
			c.notef("runstate: stage %s is not running: attempt %d's session %s is gone; the next session to open the run records it as interrupted (runstate status %s lists the blockers)", s.Name, s.Attempt, short(s.Session), quoteArg(dir))
		}
	}
	for _, e := range st.Effects {
		if e.State == runstate.EffectIntent && !alive[e.Session] {
			c.notef("runstate: effect %s is in doubt: session %s is gone between the intent and a confirmation (runstate status %s says what to do)", e.Key, short(e.Session), quoteArg(dir))
		}
	}
	if asJSON {
		if err := writeJSON(c.out, out); err != nil {
			return c.fail(err)
		}
		return exitOK
	}
	// The text is the library's page, escaped as it was rendered; a file
	// that another program or version wrote is escaped here (Page: its
	// line breaks and backslashes stay).
	if _, err := fmt.Fprint(c.out, escape.Page(out.Text)); err != nil {
		return c.fail(err)
	}
	return exitOK
}

var metricsCmd = &command{
	name:     "metrics",
	synopsis: "[-json] DIR...",
	short:    "resumption metrics of one run, or summed over several",
	long: `Metrics prints the figures that say whether resuming works, derived from
the ledger of each run given, and summed when several are given:

  sessions, resumed sessions     sessions that opened the run / an existing run
  interrupted attempts           stage attempts whose session died (recovery)
  skipped on resume              done stages a resumed session did not redo
  duplicated work                stages redone although their evidence held (want 0)
  stale rejections               stages redone because their evidence changed
  operator invalidations, failures
  effects deduplicated           side effects not sent again (stored receipt or Check)
  effects duplicated             side effects sent twice (want 0)
  effects unconfirmed            side effects whose outcome a person must settle
  effects in doubt               side effects whose session died before a
                                 confirmation: the next Effect call asks Check
  time to handoff                longest time from a resumed session's open to
                                 its first record of work (the maximum over runs)

It takes no lock and writes nothing. Exit status 1 when a run cannot be
read (nothing is printed then).

With -json it prints one JSON object: {"runs": [{"dir", "id", "seq",
"metrics"}], "total": metrics}, where metrics is the library's
runstate.Metrics (sessions, resumed_sessions, interrupted,
skipped_on_resume, duplicated_work, stale_rejections, invalidations,
failures, effects_deduplicated, effects_duplicated, effects_unconfirmed,
effects_in_doubt, time_to_first_record_ns).`,
	min: 1, max: -1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		asJSON := fs.Bool("json", false, "print JSON")
		return func(c *cli, args []string) int { return c.metrics(args, *asJSON) }
	},
}

type runMetrics struct {
	Dir     string           `json:"dir"`
	ID      string           `json:"id"`
	Seq     int64            `json:"seq"`
	Metrics runstate.Metrics `json:"metrics"`
}

type metricsJSON struct {
	Runs  []runMetrics     `json:"runs"`
	Total runstate.Metrics `json:"total"`
}

func (c *cli) metrics(addrs []string, asJSON bool) int {
	ctx := context.Background()
	out := metricsJSON{Runs: []runMetrics{}}
	failed := false
	seen := map[[2]string]string{} // a run's id and address: the name it was read by first
	for _, addr := range addrs {
		st, name, err := c.inspectOne(ctx, addr)
		if err != nil {
			c.fail(err)
			failed = true
			continue
		}
		// One run named twice (a path spelt two ways, an address and a
		// working directory of it) counts once: the same id at the same
		// place. A copy of a run directory keeps the id, elsewhere.
		key := [2]string{st.ID, st.Address}
		if _, ok := scheme(st.Address); !ok {
			if real, err := filepath.EvalSymlinks(st.Address); err == nil {
				key[1] = real // a run directory by a link's path too
			}
		}
		if first, ok := seen[key]; ok && st.ID != "" && st.Address != "" {
			c.notef("runstate: %s is run %s at %s, which %s named already: counted once", name, st.ID, st.Address, first)
			continue
		}
		seen[key] = name
		out.Runs = append(out.Runs, runMetrics{Dir: name, ID: st.ID, Seq: st.Seq, Metrics: st.Metrics})
		m, t := st.Metrics, &out.Total
		t.Sessions += m.Sessions
		t.ResumedSessions += m.ResumedSessions
		t.Interrupted += m.Interrupted
		t.SkippedOnResume += m.SkippedOnResume
		t.DuplicatedWork += m.DuplicatedWork
		t.StaleRejections += m.StaleRejections
		t.Invalidations += m.Invalidations
		t.Failures += m.Failures
		t.EffectsDeduplicated += m.EffectsDeduplicated
		t.EffectsDuplicated += m.EffectsDuplicated
		t.EffectsUnconfirmed += m.EffectsUnconfirmed
		t.EffectsInDoubt += m.EffectsInDoubt
		t.TimeToFirstRecord = max(t.TimeToFirstRecord, m.TimeToFirstRecord)
	}
	if failed {
		return exitFail
	}
	if asJSON {
		if err := writeJSON(c.out, out); err != nil {
			return c.fail(err)
		}
		return exitOK
	}
	t := out.Total
	w := bufio.NewWriter(c.out)
	defer w.Flush()
	rows := []struct {
		name string
		v    int
		note string
	}{
		{"runs", len(out.Runs), ""},
		{"sessions", t.Sessions, ""},
		{"resumed sessions", t.ResumedSessions, ""},
		{"interrupted attempts", t.Interrupted, "recovered by a later session"},
		{"skipped on resume", t.SkippedOnResume, "done work not redone"},
		{"duplicated work", t.DuplicatedWork, "want 0"},
		{"stale rejections", t.StaleRejections, "redone: evidence changed, outputs altered, or expired"},
		{"invalidations", t.Invalidations, "by an operator"},
		{"failures", t.Failures, ""},
		{"effects deduplicated", t.EffectsDeduplicated, "not sent again"},
		{"effects duplicated", t.EffectsDuplicated, "want 0"},
		{"effects unconfirmed", t.EffectsUnconfirmed, "a person must resolve them"},
		{"effects in doubt", t.EffectsInDoubt, "the next Effect call asks Check"},
	}
	for _, r := range rows {
		line := fmt.Sprintf("%-22s %6d", r.name, r.v)
		if r.note != "" {
			line += "  " + r.note
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "%-22s %6s  longest, open to first record of a resumed session\n", "time to handoff", t.TimeToFirstRecord.Round(time.Millisecond/10))
	return exitOK
}

// inspectOne opens addr, inspects its run and closes it; it returns the
// address's name for messages too.
func (c *cli) inspectOne(ctx context.Context, addr string) (*runstate.Status, string, error) {
	src, err := c.open(ctx, addr)
	if err != nil {
		return nil, "", err
	}
	defer src.Close()
	st, err := src.Inspect(ctx)
	return st, src.Name(), err
}
