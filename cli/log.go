package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

var logCmd = &command{
	name:     "log",
	synopsis: "[-stage S] [-since SEQ] [-follow] [-json] DIR",
	short:    "the ledger, one readable line a record; -follow tails it",
	long: `Log prints the ledger of the run in DIR, one line a record:

  SEQ  TIME (UTC)  SESSION  EV  STAGE#ATTEMPT or KEY  what happened

SESSION is the last 8 hex digits of the session id. The rest of the line
summarizes the record: the reason, the error, the outputs, who approved.
Text from the record is escaped as Go's strconv.Quote escapes it (\x1b,
\u202e, \\): it never acts on the terminal.
The whole hash chain is checked as it is read; a torn last line (a writer
died mid-append) is not shown. A damaged ledger stops the log with an error
naming the line and byte offset (exit 1); a ledger that holds no record
(emptied, or a run whose creation never finished) is an error too, as
status says it.

The records are those status shows: in a run directory after a machine
crash (a power loss), the acknowledged records that only logs/ledger.wal
holds, which the ledger lost and the next session copies back, are shown in
their place.

-follow keeps printing records as other processes append them (it reads the
ledger again every 100 ms, by its path; a database run: its store says how)
until it is interrupted (SIGINT, Ctrl-C), then exits 0. A last line without
its newline is waited on (a write in progress, or a torn tail the next
writer cuts); a damaged line that ends in a newline stops it with the line
(exit 1). A file renamed over the ledger (a backup restored, an edit with
sed -i) is followed from the record after the last shown when it holds the
records shown, with a note on standard error; when it does not (fewer
records, or other ones), or the ledger was cut below them or removed, log
says so and exits 1.

With -json each record is printed as one JSON object a line, in the
ledger's own format (seq, at, ev, session, stage, attempt, inputs, outputs,
key, class, error, reason, note, by, data, prev), with unprintable runes
such as U+202E written as \u escapes (the same JSON values), and without
each line's checksum (crc): 'runstate export' prints the exact lines.`,
	min: 1, max: 1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		var o logOptions
		fs.StringVar(&o.stage, "stage", "", "only the records of stage `S`")
		fs.Int64Var(&o.since, "since", 0, "only the records after seq `SEQ` (seq > SEQ)")
		fs.BoolVar(&o.follow, "follow", false, "keep printing records as they are appended, until interrupted")
		fs.BoolVar(&o.json, "json", false, "print each record as JSON, one a line")
		return func(c *cli, args []string) int {
			if o.since < 0 {
				return c.usageError("log", "-since must not be negative")
			}
			return c.onSource(args[0], func(ctx context.Context, src Source) int { return c.log(ctx, src, o) })
		}
	},
}

type logOptions struct {
	stage  string
	since  int64
	follow bool
	json   bool
}

func (c *cli) log(ctx context.Context, src Source, o logOptions) int {
	w := bufio.NewWriter(c.out)
	defer w.Flush()
	show := func(r *runstate.Record) error {
		if r.Seq <= o.since || (o.stage != "" && r.Stage != o.stage) {
			return nil
		}
		if o.json {
			return writeRecordJSON(w, r)
		}
		_, err := fmt.Fprintln(w, formatRecord(r))
		return err
	}
	var n int64
	err := src.ReadLedger(ctx, func(r *runstate.Record) error {
		n = r.Seq
		return show(r)
	})
	if err != nil {
		w.Flush()
		return c.fail(err)
	}
	if n == 0 {
		// No record is no run: an emptied ledger, or a run whose create
		// record never made it; Inspect says which, as status does.
		if _, err := src.Inspect(ctx); err != nil {
			return c.fail(err)
		}
	}
	if !o.follow {
		return exitOK
	}
	if err := w.Flush(); err != nil {
		return c.fail(err)
	}
	err = src.Follow(ctx, n, func(r *runstate.Record) error {
		if err := show(r); err != nil {
			return err
		}
		return w.Flush()
	})
	if err != nil {
		w.Flush()
		return c.fail(err)
	}
	return exitOK
}

// writeRecordJSON writes r as one line of JSON, with every rune a terminal
// could act on written as a \u escape (escape.JSON): the same values.
func writeRecordJSON(w io.Writer, r *runstate.Record) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return err
	}
	_, err := w.Write(escape.JSON(b.Bytes()))
	return err
}

// formatRecord renders one record as a log line. Every text from the
// record is escaped (escape.Text): the line holds no control character.
func formatRecord(r *runstate.Record) string {
	subject := escape.Text(r.Stage)
	if r.Stage != "" && r.Attempt > 0 {
		subject += fmt.Sprintf("#%d", r.Attempt)
	}
	if r.Key != "" {
		if subject != "" {
			subject += " "
		}
		subject += "key " + escape.Text(r.Key)
	}
	if subject == "" {
		subject = "-"
	}
	return strings.TrimRight(fmt.Sprintf("%6d  %s  %-8s  %-11s  %-18s  %s",
		r.Seq, r.At.UTC().Format("2006-01-02T15:04:05.000Z"), short(r.Session), escape.Text(r.Ev), subject, summary(r)), " ")
}

// summary says in a few words what a record holds.
func summary(r *runstate.Record) string {
	var parts []string
	add := func(format string, args ...any) { parts = append(parts, fmt.Sprintf(format, args...)) }
	switch r.Ev {
	case "create":
		var d struct {
			ID       string `json:"id"`
			Request  string `json:"request"`
			Revision string `json:"revision"`
			Format   int    `json:"format"`
		}
		_ = json.Unmarshal(r.Data, &d)
		add("run %s, request \"%s\"", escape.Text(d.ID), oneLine(d.Request, 80))
		if d.Revision != "" {
			add("revision %s", escape.Text(d.Revision))
		}
		add("format %d", d.Format)
	case "open":
		var d struct {
			PID      int    `json:"pid"`
			Host     string `json:"host"`
			Revision string `json:"revision"`
		}
		_ = json.Unmarshal(r.Data, &d)
		add("pid %d on %s", d.PID, escape.Text(d.Host))
		if d.Revision != "" {
			add("revision %s", escape.Text(d.Revision))
		}
	case "close":
		var d struct {
			Skipped      int `json:"skipped"`
			Deduplicated int `json:"deduplicated"`
		}
		_ = json.Unmarshal(r.Data, &d)
		if d.Skipped > 0 {
			add("%d done stages skipped", d.Skipped)
		}
		if d.Deduplicated > 0 {
			add("%d effects deduplicated", d.Deduplicated)
		}
	case "plan":
		var names []string
		_ = json.Unmarshal(r.Data, &names)
		add("%s", oneLine(strings.Join(names, ", "), 120))
	case "begin":
		if len(r.Inputs) > 0 {
			names := make([]string, 0, len(r.Inputs))
			for k := range r.Inputs {
				names = append(names, k)
			}
			sort.Strings(names)
			add("inputs %s", oneLine(strings.Join(names, ", "), 100))
		}
	case "intent":
		if len(r.Data) > 0 {
			add("request %s", oneLine(string(r.Data), 80))
		}
	case "confirm":
		add("receipt %s", oneLine(string(r.Data), 80))
	case "resolve":
		add("not sent")
	}
	if r.Class != "" && r.Ev == "fail" {
		add("%s", escape.Text(r.Class))
	}
	if r.Error != "" {
		add("error: %s", oneLine(r.Error, 120))
	}
	if r.Reason != "" && r.Ev != "intent" && r.Ev != "unconfirmed" {
		add("%s", oneLine(r.Reason, 120))
	}
	if len(r.Outputs) > 0 {
		o := r.Outputs[0]
		s := fmt.Sprintf("-> %s (sha256:%.12s, %d B)", escape.Text(o.Path), escape.Text(o.SHA256), o.Size)
		if len(r.Outputs) > 1 {
			s += fmt.Sprintf(" +%d more", len(r.Outputs)-1)
		}
		add("%s", s)
	}
	if r.By != "" {
		add("by %s", oneLine(r.By, 120))
	}
	if r.Note != "" {
		add("note: %s", oneLine(r.Note, 120))
	}
	return strings.Join(parts, "; ")
}
