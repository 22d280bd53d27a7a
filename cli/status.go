package cli

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/escape"
)

var statusCmd = &command{
	name:     "status",
	synopsis: "[-json] DIR",
	short:    "identity, next steps, stages, blockers; exit 3 when something blocks",
	long: `Status shows the run in DIR as the ledger has it: its identity (id,
request, revision, environment), the next steps from the handoff, a table of
stages (state, attempts, last change, outputs) and the blockers: stages
awaiting a person or failed fatally, side effects whose outcome is unknown
(in doubt: the next Effect call asks the receiving system; unconfirmed: a
person must resolve them), and stages interrupted because their session
died. A stage still "running" whose session is gone (its lock in
logs/sessions is free) is reported as interrupted, and an effect's intent
whose session is gone as in doubt: the next session that opens the run
records them so. A session whose lock file this user cannot open (another
user's run) is taken for alive, the safe side, and a note says that status
cannot tell (on standard error with -json). Text from the records is
escaped (\x1b, \u202e ...): it never acts on the terminal.

It takes no lock and writes nothing; it is safe while agents work on the
run. Exit status 0 when nothing blocks the run, 3 when something does, 1
when the run cannot be read.

With -json it prints one JSON object: the library's runstate.Status (dir,
id, request, revision, environment, format, created, seq, plan, stages,
artifacts, effects, sessions, blockers, next, done, remaining, metrics,
torn), with the interrupted stages and in-doubt effects above added to
blockers, plus
"blocked" (bool) and "handoff" (the handoff text).`,
	min: 1, max: 1,
	setup: func(fs *flag.FlagSet) func(*cli, []string) int {
		asJSON := fs.Bool("json", false, "print JSON")
		return func(c *cli, args []string) int {
			return c.onSource(args[0], func(ctx context.Context, src Source) int { return c.status(ctx, src, *asJSON) })
		}
	},
}

// statusJSON is the -json shape of status.
type statusJSON struct {
	*runstate.Status
	Blocked bool   `json:"blocked"`
	Handoff string `json:"handoff"`
}

func (c *cli) status(ctx context.Context, src Source, asJSON bool) int {
	st, handoff, err := inspect(ctx, src)
	if err != nil {
		return c.fail(err)
	}
	dir := src.Name()
	alive := sessionsAlive(ctx, src, st)
	unsure := unsureOf(src, alive)
	var gone []runstate.Blocker
	for _, s := range st.Stages {
		if s.State == runstate.StateRunning && !alive[s.Session] {
			gone = append(gone, runstate.Blocker{Kind: "interrupted", Stage: s.Name,
				Reason: fmt.Sprintf("attempt %d's session %s is gone; the next session to open the run records it as interrupted", s.Attempt, short(s.Session)),
				Action: "run the pipeline again: the stage begins anew"})
		}
	}
	if len(gone) > 0 { // after the other stage blockers, before the effects
		i := 0
		for i < len(st.Blockers) && st.Blockers[i].Stage != "" {
			i++
		}
		st.Blockers = slices.Insert(st.Blockers, i, gone...)
	}
	// An intent whose session is gone is in doubt, as the next Open
	// records it.
	for _, e := range st.Effects {
		if e.State == runstate.EffectIntent && !alive[e.Session] {
			st.Blockers = append(st.Blockers, runstate.Blocker{Kind: "in-doubt", Key: e.Key,
				Reason: fmt.Sprintf("session %s is gone between the intent and a confirmation; the next session to open the run records it as in doubt", short(e.Session)),
				Action: "run the pipeline again: its next Effect call for this key asks the receiving system (Check) and settles it; " +
					"only if it has no Check, or Check fails, must a person check the receiving system, then: runstate resolve " + quoteArg(cmp.Or(st.Address, dir)) + " " + quoteArg(e.Key) + " -sent RECEIPT -by NAME (or -not-sent)"})
		}
	}
	blocked := len(st.Blockers) > 0
	code := exitOK
	if blocked {
		code = exitBlocked
	}
	// Sessions taken for alive because their lock could not be tried.
	var unsureNotes []string
	for _, id := range slices.Sorted(maps.Keys(unsure)) {
		unsureNotes = append(unsureNotes, fmt.Sprintf("cannot tell whether session %s is alive (%v): it is taken for alive, so a stage it began is not shown interrupted; %s", short(id), unsure[id], unsureAction(unsure[id], "run status as the user that runs the run's sessions")))
	}
	if asJSON {
		for _, n := range unsureNotes {
			c.notef("runstate: %s", n)
		}
		if err := writeJSON(c.out, statusJSON{Status: st, Blocked: blocked, Handoff: handoff}); err != nil {
			return c.fail(err)
		}
		return code
	}

	w := bufio.NewWriter(c.out)
	defer w.Flush()
	fmt.Fprintf(w, "run       %s\n", escape.Text(st.ID))
	fmt.Fprintf(w, "request   %s\n", oneLine(st.Request, 200))
	if st.Revision != "" {
		fmt.Fprintf(w, "revision  %s\n", escape.Text(st.Revision))
	}
	if len(st.Environment) > 0 {
		keys := make([]string, 0, len(st.Environment))
		for k := range st.Environment {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			keys[i] = escape.Text(k) + "=" + escape.Text(st.Environment[k])
		}
		fmt.Fprintf(w, "env       %s\n", strings.Join(keys, " "))
	}
	fmt.Fprintf(w, "created   %s\n", st.Created.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "ledger    seq %d (%s)\n", st.Seq, escape.Text(src.Ledger()))
	if len(st.Sessions) == 0 {
		fmt.Fprintf(w, "sessions  none open\n")
	} else {
		var ss []string
		for _, s := range st.Sessions {
			state := "gone"
			switch {
			case unsure[s.ID] != nil:
				state = "alive or gone: cannot tell"
			case alive[s.ID]:
				state = "alive"
			}
			ss = append(ss, fmt.Sprintf("%s (pid %d on %s, %s)", short(s.ID), s.PID, escape.Text(s.Host), state))
		}
		fmt.Fprintf(w, "sessions  %s\n", strings.Join(ss, "; "))
	}
	for _, n := range unsureNotes {
		fmt.Fprintf(w, "note      %s\n", escape.Page(n))
	}
	if st.Torn > 0 {
		fmt.Fprintf(w, "note      the ledger ends in a torn line of %d bytes (a writer died mid-append; never acknowledged): the next writer, or 'runstate repair %s', cuts it\n", st.Torn, quoteArg(dir))
	}
	// The handoff's second paragraph: progress, last, next, then.
	if paras := strings.Split(handoff, "\n\n"); len(paras) > 1 {
		fmt.Fprintf(w, "\n%s\n", escape.Page(strings.TrimRight(paras[1], "\n")))
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STAGE\tSTATE\tATTEMPTS\tLAST CHANGE\tOUTPUTS\tNOTE")
	for _, s := range st.Stages {
		last := "-"
		if s.Seq > 0 {
			last = fmt.Sprintf("%s seq %d", s.At.UTC().Format(time.RFC3339), s.Seq)
		}
		outs := "-"
		if len(s.Outputs) > 0 {
			outs = escape.Text(s.Outputs[0].Path)
			if len(s.Outputs) > 1 {
				outs += fmt.Sprintf(" +%d more", len(s.Outputs)-1)
			}
		}
		note := s.Error
		if note == "" {
			note = s.Reason
		}
		if note == "" {
			note = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", escape.Text(s.Name), escape.Text(s.State), s.Attempt, last, outs, oneLine(note, 60))
	}
	tw.Flush()

	fmt.Fprintln(w)
	if !blocked {
		fmt.Fprintln(w, "blockers  none")
		return code
	}
	fmt.Fprintf(w, "blockers  %d\n", len(st.Blockers))
	for _, b := range st.Blockers {
		what := escape.Text(b.Stage)
		if what == "" {
			what = "effect " + escape.Text(b.Key)
		}
		// Action is the library's text with names quoted (escape.Arg);
		// Page makes sure of it.
		fmt.Fprintf(w, "  %s (%s): %s\n    do: %s\n", what, escape.Text(b.Kind), oneLine(b.Reason, 200), escape.Page(asTyped(b.Action, st.Address, dir)))
	}
	return code
}

// inspect reads the status and the handoff of the run at src, both as of
// the same ledger seq (a writer may append between the two reads: then it
// reads again).
func inspect(ctx context.Context, src Source) (*runstate.Status, string, error) {
	for tries := 0; ; tries++ {
		st, err := src.Inspect(ctx)
		if err != nil {
			return nil, "", err
		}
		h, err := src.NextSteps(ctx)
		if err != nil {
			return nil, "", err
		}
		if seq, err := handoffSeq(h); (err == nil && seq == st.Seq) || tries == 4 {
			return st, h, nil
		}
	}
}

// handoffSeq reads the ledger seq that a handoff names in its first line.
func handoffSeq(text string) (int64, error) {
	line, _, _ := strings.Cut(text, "\n")
	_, after, ok := strings.Cut(line, "as of ledger seq ")
	if !ok {
		return 0, errors.New("its first line names no ledger seq")
	}
	num, _, _ := strings.Cut(after, " ")
	seq, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("its first line names a bad seq %q", num)
	}
	return seq, nil
}

// sessionsAlive tells, for each session the status names (open, or of a
// running stage, or of an effect's intent), whether its process still
// holds it (Source.Alive).
func sessionsAlive(ctx context.Context, src Source, st *runstate.Status) map[string]bool {
	var ids []string
	seen := map[string]bool{}
	check := func(id string) {
		if !seen[id] && id != "" {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, s := range st.Sessions {
		check(s.ID)
	}
	for _, s := range st.Stages {
		if s.State == runstate.StateRunning {
			check(s.Session)
		}
	}
	for _, e := range st.Effects {
		if e.State == runstate.EffectIntent {
			check(e.Session)
		}
	}
	if len(ids) == 0 {
		return map[string]bool{}
	}
	return src.Alive(ctx, ids)
}

// unsurer is a Source that says which sessions its Alive took for alive
// only because it could not tell (a run directory's session lock file
// that this user cannot open; a database server restarted so recently
// that its sessions may still be taking their locks again), with why: an
// error that may say what to do with an Action() string method.
type unsurer interface {
	Unsure(sessions []string) map[string]error
}

// unsureAction is what to do about a session whose liveness a Source
// could not tell, why: why's own Action when it has one (a store that
// knows when it can tell), else def.
func unsureAction(why error, def string) string {
	var a interface{ Action() string }
	if errors.As(why, &a) {
		return a.Action()
	}
	return def
}

// unsureOf returns, of the sessions alive says are alive, those src could
// not tell, with why; none when src cannot say.
func unsureOf(src Source, alive map[string]bool) map[string]error {
	u, ok := src.(unsurer)
	if !ok {
		return nil
	}
	var ids []string
	for id, ok := range alive {
		if ok {
			ids = append(ids, id)
		}
	}
	return u.Unsure(ids)
}

// short is the short form of a session id: its last 8 hex digits (a UUIDv7
// begins with a timestamp, so sessions opened close together share their
// first digits).
func short(id string) string {
	if id == "" {
		return "-"
	}
	id = strings.ReplaceAll(id, "-", "")
	if len(id) > 8 {
		id = id[len(id)-8:]
	}
	return escape.Text(id)
}

// oneLine folds s to one line of at most max bytes (before escaping), and
// escapes what could act on a terminal (escape.Text).
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		cut := max - 3
		for cut > 0 && !isRuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return escape.Text(s)
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }

// quoteArg quotes s for a shell when it needs it (escape.Arg): the
// result holds no control character.
func quoteArg(s string) string { return escape.Arg(s) }

// asTyped names the run as the user typed it (name) in the commands of
// text (a Status Action, a Verify fix, the advice of an error), where the
// library names it addr (Status.Address, Report.Address: a directory's
// absolute path, a store's address): each argument that is addr quoted
// for a shell, after a space and before a space, a comma, a semicolon, a
// parenthesis or the end.
func asTyped(text, addr, name string) string {
	if addr == "" || addr == name {
		return text
	}
	arg := " " + quoteArg(addr)
	var b strings.Builder
	for {
		i := strings.Index(text, arg)
		if i < 0 {
			break
		}
		end := i + len(arg)
		b.WriteString(text[:i])
		if end == len(text) || strings.IndexByte(" ,;)", text[end]) >= 0 {
			b.WriteString(" " + quoteArg(name))
		} else {
			b.WriteString(arg)
		}
		text = text[end:]
	}
	b.WriteString(text)
	return b.String()
}

// writeJSON writes v as indented JSON, with every rune a terminal could
// act on written as a \u escape (escape.JSON): the same values. JSON that
// indenting would make more than a few times longer (a receipt nested a
// few hundred levels deep in a record: each level indents every line
// below it) is written compact, on one line.
func writeJSON(w io.Writer, v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	if n := indentedSize(b.Bytes()); n <= 8*int64(b.Len())+1<<20 {
		var ind bytes.Buffer
		ind.Grow(int(n))
		if err := json.Indent(&ind, b.Bytes(), "", "  "); err != nil {
			return err
		}
		b = ind
	}
	_, err := w.Write(escape.JSON(b.Bytes()))
	return err
}

// indentedSize is at least the size of compact JSON b indented by two
// spaces a level: each line break that indenting adds, after a '[', '{'
// or ',' and before a ']' or '}', is followed by the level's indent.
func indentedSize(b []byte) int64 {
	n, depth, str := int64(len(b)), int64(0), false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case str && c == '\\':
			i++
		case c == '"':
			str = !str
		case str:
		case c == '[' || c == '{':
			depth++
			n += 1 + 2*depth
		case c == ']' || c == '}':
			depth--
			n += 1 + 2*depth
		case c == ',':
			n += 1 + 2*depth
		case c == ':':
			n++
		}
	}
	return n
}
