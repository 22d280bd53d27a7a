package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/runstate/runstate"
)

// Source is one run, reached at an address: a run directory, or a run in a
// database (see Opener). The read methods take no lock and write nothing;
// Open starts a session that writes, as runstate.Open does. A Source is
// used by one command, from one goroutine.
type Source interface {
	// Name is the address for messages and for the advice printed after
	// a blocker ("runstate approve NAME ..."): a directory as given, or a
	// URL without its password.
	Name() string
	// Ledger says where the ledger is kept, for the status page: a
	// directory's logs/ledger.jsonl, or a database table and run.
	Ledger() string
	// Inspect returns the run's status as its ledger has it
	// (runstate.Inspect). An address that holds no run is an error that
	// says so.
	Inspect(ctx context.Context) (*runstate.Status, error)
	// NextSteps renders the handoff from the ledger (runstate.NextSteps).
	NextSteps(ctx context.Context) (string, error)
	// Handoff returns the handoff as the last writer stored it (a run
	// directory's logs/next-steps.txt) and where it is kept (for
	// messages). It may be behind the ledger: 'runstate next' compares the
	// seq its first line names with the ledger's.
	Handoff(ctx context.Context) (text, where string, err error)
	// ReadLedger calls fn for each record in seq order, checking the hash
	// chain as it reads (runstate.ReadLedger); a torn last line is not
	// passed.
	ReadLedger(ctx context.Context, fn func(*runstate.Record) error) error
	// Follow calls fn for each record appended after seq after, in order,
	// checking that each continues the chain, until ctx is done; then it
	// returns nil.
	Follow(ctx context.Context, after int64, fn func(*runstate.Record) error) error
	// Export writes the ledger's complete lines, the exact bytes, each
	// ending in '\n', checking the chain: a valid logs/ledger.jsonl with
	// the records ReadLedger passes (a run directory's: those only its
	// journal holds after a machine crash too).
	Export(ctx context.Context, w io.Writer) (records int64, err error)
	// Verify checks the whole run without trusting any snapshot
	// (runstate.Verify).
	Verify(ctx context.Context) (*runstate.Report, error)
	// VerifyChecks says, for verify's "ok" line, what Verify checked
	// besides the ledger.
	VerifyChecks() string
	// Alive tells, for each session id, whether the session's process
	// still holds it. Unknown is true (the safe side). It takes no lock
	// that a writer could wait on and writes nothing.
	Alive(ctx context.Context, sessions []string) map[string]bool
	// Open opens a session on the run, which must exist (Inspect said so),
	// as runstate.Open does: its records are durable as Run's methods
	// document. The caller closes the Run before the Source.
	Open(ctx context.Context, opts *runstate.Options) (*runstate.Run, error)
	// Close releases what the Source holds (a database pool, a temporary
	// working directory).
	Close() error
}

// Opener opens the run at addr, an address whose scheme the Opener was
// registered for in Options.Sources. It fails when the address is
// malformed or its store cannot be reached, with an error that says what
// to do; a run that does not exist is reported by the Source's methods.
type Opener func(ctx context.Context, addr string) (Source, error)

// Lister lists the runs a store holds, for ls: addr is an address whose
// scheme the Lister was registered for in Options.Lists, naming the store
// (for PostgreSQL a database and schema, without run=NAME) or one run in
// it. It returns a Source for each run, in any order, that the caller
// reads and does not Close; closeAll releases them all (one connection
// pool for all, say). It fails when the address is malformed or the store
// cannot be reached, with an error that says what to do.
type Lister func(ctx context.Context, addr string) (runs []Source, closeAll func(), err error)

// Runner opens a session for a pipeline command (exec, effect, plan, skip,
// await) on the run at addr, an address whose scheme the Runner was
// registered for in Options.Runners, with workDir, a directory on this
// machine, as the run's working directory: the stage's files are written
// there, as in a run directory, and the store names addr in its
// runstate.WorkDirFile, so that later commands given workDir find the run.
// With opts.Request it creates the run when the store holds none (and
// what the store needs for it, a database schema say), as runstate.Open
// does; without, a run that is not there is an error wrapping
// runstate.ErrInvalid that says to give -request TEXT, and nothing is
// written. Its waits end when ctx does, and at opts.LockTimeout for the
// run's lock. What the Run's records make durable is what runstate.Open's
// Run says. release frees what the Run used (a connection pool); the
// caller calls it after closing the Run.
type Runner func(ctx context.Context, addr, workDir string, opts *runstate.Options) (r *runstate.Run, release func(), err error)

// lastRecorder is a Source that tells when its last record was written
// without reading the whole ledger (ls's LAST RECORD): seq is the last
// record's as Inspect found it, 0 when Inspect failed. A Source that is
// not one shows none.
type lastRecorder interface {
	LastRecord(ctx context.Context, seq int64) (time.Time, error)
}

// Options configure Run. The zero value (or nil) reads run directories only.
type Options struct {
	// Sources maps a URL scheme ("postgres") to the Opener of its
	// addresses. An argument with another scheme that is not an existing
	// directory is refused; every other argument is a run directory.
	Sources map[string]Opener
	// Lists maps a URL scheme to the Lister that ls uses for its
	// addresses. Without one, ls refuses the scheme's addresses.
	Lists map[string]Lister
	// Runners maps a URL scheme to the Runner that the pipeline commands
	// use for its addresses: given with -at ADDRESS, or named by the
	// working directory DIR. Without one, they refuse the scheme's
	// addresses and working directories.
	Runners map[string]Runner
	// Usage is a paragraph for 'runstate help' saying which addresses
	// Sources take, e.g. "DIR may also be postgres://...?run=NAME".
	Usage string
}

// scheme returns the URL scheme of addr ("postgres" of
// "postgres://h/db"), if it has one.
func scheme(addr string) (string, bool) {
	s, _, ok := strings.Cut(addr, "://")
	if !ok || s == "" {
		return "", false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return "", false
		}
	}
	return strings.ToLower(s), true
}

// pgCommand is how to get the runstate command that reads PostgreSQL runs:
// built from a checkout of runstate (go install @latest refuses pgstore's
// go.mod, which has a replace directive).
const pgCommand = "cd pgstore && go build -o runstate ./cmd/runstate (in a checkout of github.com/runstate/runstate)"

// Noter is a Source that says things as a command goes on (log -follow
// waiting for a server that does not answer): open gives it the command's
// note, which prints one line on standard error, escaped as a message.
type Noter interface {
	SetNote(note func(string))
}

// open returns the Source of addr: the Opener registered for its scheme,
// or the run directory addr.
func (c *cli) open(ctx context.Context, addr string) (Source, error) {
	src, err := c.openSource(ctx, addr)
	if n, ok := src.(Noter); ok && err == nil {
		n.SetNote(func(s string) { c.notef("%s", s) })
	}
	return src, err
}

func (c *cli) openSource(ctx context.Context, addr string) (Source, error) {
	if s, ok := scheme(addr); ok {
		if o := c.sources[s]; o != nil {
			return o(ctx, addr)
		}
		if _, err := os.Stat(addr); err != nil {
			hint := "give a run directory"
			if s == "postgres" || s == "postgresql" {
				hint = "the command that reads PostgreSQL runs is built with: " + pgCommand
			}
			return nil, fmt.Errorf("%s is a %s:// address, and this runstate command reads run directories only; %s", Redact(addr), s, hint)
		}
	}
	if to, ok := workDirOf(addr); ok {
		if s, _ := scheme(to); c.sources[s] != nil {
			return c.openWorkDir(ctx, addr, to, c.sources[s])
		}
		hint := "run this command on that address with the runstate command that reads its store"
		if s, _ := scheme(to); s == "postgres" || s == "postgresql" {
			hint = "build the runstate command that reads PostgreSQL runs (" + pgCommand + ") and run it on that address"
		}
		return nil, fmt.Errorf("%s is a working directory of the run at %s (its %s says so; the records are there, not here): %s", addr, Redact(to), runstate.WorkDirFile, hint)
	}
	if err := isFile(addr); err != nil {
		return nil, err
	}
	if err := notADir(addr); err != nil {
		return nil, err
	}
	return &dirSource{dir: addr, note: func(s string) { c.notef("%s", s) }}, nil
}

// notADir explains a DIR that has no ledger and no run address to read
// instead: one whose logs/run.json names none (damaged, emptied, not a
// regular file, over 64 KiB), which would otherwise be reported as a
// directory without a ledger, and a libpq key=value connection string
// given where an address goes (reported as a missing directory, with
// its password). nil for anything else: the run directory's own errors
// name it.
func notADir(addr string) error {
	if _, err := os.Stat(ledgerIn(addr)); err == nil {
		return nil
	}
	wd := filepath.Join(addr, filepath.FromSlash(runstate.WorkDirFile))
	if _, err := os.Lstat(wd); err == nil {
		why := "empty, damaged, not a regular file or over 64 KiB"
		if _, err := runstate.ReadWorkDirFile(addr); err != nil {
			why = err.Error()
		}
		return fmt.Errorf("%s has no %s, and its %s names no run address (%s): if it is the working directory of a run kept elsewhere, give that run's address instead of %s (postgres://USER@HOST:PORT/DB?run=NAME), and restore or remove %s", addr, "logs/ledger.jsonl", runstate.WorkDirFile, why, addr, wd)
	}
	return conninfoError(addr)
}

// conninfoError refuses a libpq key=value connection string given where
// a run directory or address goes (a directory by that name does not
// exist), without showing it: its password, if it has one, could be
// anywhere in it (quoted, escaped, after any white space), and masking
// it is a parser's work that the message does not need. nil for
// anything else.
func conninfoError(addr string) error {
	if _, err := os.Lstat(addr); err == nil || !looksLikeConninfo(addr) {
		return nil
	}
	return errors.New("the DIR given is a key=value connection string (not shown: it may hold a password), which runstate does not take: give a run address, postgres://USER@HOST:PORT/DB?run=NAME (other settings as ?key=value parameters; the password in PGPASSWORD or ~/.pgpass); if it is a directory to make, create it first")
}

// passwordSetting is a password (or sslpassword) setting anywhere in a
// text, spelt in any case, with white space before its '=' or none.
var passwordSetting = regexp.MustCompile(`(?i)password[ \t\n\v\f\r]*=`)

// conninfoKeys are the libpq settings (and the command's run and schema)
// that make a key=value connection string of a text.
var conninfoKeys = map[string]bool{
	"host": true, "hostaddr": true, "port": true, "dbname": true, "user": true, "password": true,
	"passfile": true, "connect_timeout": true, "options": true, "application_name": true,
	"sslmode": true, "sslpassword": true, "sslkey": true, "sslcert": true, "sslrootcert": true,
	"sslcrl": true, "service": true, "target_session_attrs": true, "run": true, "schema": true,
}

// looksLikeConninfo reports whether s reads as a libpq key=value
// connection string ("host=db dbname=agents user=agent"): one with a
// password setting anywhere, whatever the rest is (a password is never
// shown), or, read as pgx reads one (conninfoSettings), one with a URL
// that holds a user in a setting's value, or made of two settings or
// more, all of them known. A directory name with one '=' (host=a,
// runs/run=7) is not one.
func looksLikeConninfo(s string) bool {
	if passwordSetting.MatchString(s) {
		return true
	}
	settings, ok := conninfoSettings(s)
	if !ok {
		return false
	}
	known := 0
	for _, kv := range settings {
		if conninfoKeys[strings.ToLower(kv[0])] {
			known++
			if strings.Contains(kv[1], "@") {
				return true
			}
		}
	}
	return known >= 2 && known == len(settings)
}

// conninfoSettings reads s as pgx reads a key=value connection string
// (pgconn's parseKeywordValueSettings): a key up to an '=', white space
// around it, then a value quoted ('...', with backslash escapes) or up to
// the next white space (with backslash escapes). false when s is not one.
func conninfoSettings(s string) (settings [][2]string, ok bool) {
	const space = " \t\n\r\v\f"
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, false
		}
		key := strings.Trim(s[:eq], space)
		s = strings.TrimLeft(s[eq+1:], space)
		var val strings.Builder
		quoted := len(s) > 0 && s[0] == '\''
		if quoted {
			s = s[1:]
		}
		end := 0
		for ; end < len(s); end++ {
			c := s[end]
			if quoted && c == '\'' || !quoted && strings.IndexByte(space, c) >= 0 {
				break
			}
			if c == '\\' {
				if end++; end == len(s) {
					return nil, false
				}
				c = s[end]
			}
			val.WriteByte(c)
		}
		if quoted && end == len(s) {
			return nil, false // unterminated
		}
		if end < len(s) {
			end++
		}
		s = s[end:]
		settings = append(settings, [2]string{key, val.String()})
	}
	return settings, len(settings) > 0
}

// RunIdentifier is a Source that can tell the id of the run it reads
// (Run.ID: its create record's) without reading the run, "" when it
// holds no run of that name. A command given a working directory uses it
// to check that the run at the address the directory's logs/run.json
// names is the directory's own (that file also names its id): a run
// dropped and made again under its name is another run.
type RunIdentifier interface {
	RunID(ctx context.Context) (string, error)
}

// openWorkDir opens, with open, the run at the address to that working
// directory dir's logs/run.json names. An error says where the address
// came from (the user gave dir, not it); a run there with another id
// than the file's is refused, naming both (RunIdentifier).
func (c *cli) openWorkDir(ctx context.Context, dir, to string, open Opener) (Source, error) {
	rj := filepath.Join(dir, filepath.FromSlash(runstate.WorkDirFile))
	from := func(err error) error {
		return &fromWorkDir{fmt.Sprintf("%s is a working directory of the run at %s (its %s says so): ", dir, Redact(to), runstate.WorkDirFile), err}
	}
	src, err := open(ctx, to)
	if err != nil {
		return nil, from(err)
	}
	if n, ok := src.(Noter); ok {
		// RunID's wait can have something to say too (a lock).
		n.SetNote(func(s string) { c.notef("%s", s) })
	}
	ri, ok := src.(RunIdentifier)
	want := workDirID(dir)
	if !ok || want == "" {
		return src, nil
	}
	got, err := ri.RunID(ctx)
	if err != nil {
		src.Close()
		return nil, from(err)
	}
	if got != "" && got != want {
		src.Close()
		return nil, fmt.Errorf("%w: %s names run id %s at %s for the working directory %s, and the run of that name there is another one (id %s): the directory's run was dropped and made again under its name, or the address now reaches another database; to read the run there anyway, give its address (runstate status %s); remove %s if %s serves no run any more", runstate.ErrMismatch, rj, want, Redact(to), dir, got, quoteArg(Redact(to)), rj, dir)
	}
	return src, nil
}

// fromWorkDir is an error of the run at the address a working directory
// names, led by where that address came from.
type fromWorkDir struct {
	from string
	err  error
}

func (e *fromWorkDir) Error() string { return e.from + strings.TrimPrefix(e.err.Error(), "runstate: ") }
func (e *fromWorkDir) Unwrap() error { return e.err }

// workDirID is the run id dir's logs/run.json names, "" when it names
// none.
func workDirID(dir string) string {
	data, err := runstate.ReadWorkDirFile(dir)
	if err != nil || data == nil {
		return ""
	}
	var rj struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(data, &rj) != nil {
		return ""
	}
	return rj.ID
}

// workDirOf returns the run address that dir's runstate.WorkDirFile
// names, when dir is such a working directory and not a run directory
// (it has no logs/ledger.jsonl) and another Source serves the address.
func workDirOf(dir string) (string, bool) {
	if _, err := os.Stat(ledgerIn(dir)); err == nil {
		return "", false
	}
	addr, ok := runstate.RunElsewhere(dir)
	if !ok {
		return "", false
	}
	if _, ok := scheme(addr); !ok {
		return "", false
	}
	return addr, true
}

// onSource opens addr, calls fn with it and a context that SIGINT
// cancels, closes it and returns fn's exit status.
func (c *cli) onSource(addr string, fn func(ctx context.Context, src Source) int) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	src, err := c.open(ctx, addr)
	if err != nil {
		return c.fail(err)
	}
	defer src.Close()
	return fn(ctx, src)
}

// runner returns the Runner registered for addr's scheme, or nil.
func (c *cli) runner(addr string) Runner {
	s, _ := scheme(addr)
	return c.runners[s]
}

// isAddress tells whether arg is an address another Source serves, not a
// directory, for the commands that work on run directories only.
func (c *cli) isAddress(arg string) bool {
	if _, ok := scheme(arg); !ok {
		return false
	}
	if _, err := os.Stat(arg); err == nil {
		return false
	}
	return true
}

// Redact hides the passwords in a URL address (postgres://…), for
// messages: the userinfo's, what follows the user name's ':' (the
// userinfo ends at an '@' that comes before any '/', as pgx reads it),
// and the values of the password and sslpassword parameters. An unescaped '@', '/' or '?'
// in a password moves part of it out of that userinfo, so an '@' left
// after it hides everything up to the last one; and where no userinfo was
// found, everything from a ':' before the first '/' to the last '@' is
// hidden. That hides more than the password at times (the host and
// database, when a parameter's value has an '@'), never less. A path
// (no "://") comes back as it is. Safe for concurrent use.
func Redact(addr string) string {
	const mask = "xxxxx"
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		return addr
	}
	head := scheme + "://"
	userinfo, masked := false, false
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		user, _, has := strings.Cut(rest[:i], ":")
		userinfo, masked = true, has
		if has {
			user += ":" + mask
		}
		head += user + "@"
		rest = rest[i+1:]
	}
	if base, query, ok := strings.Cut(rest, "?"); ok {
		kvs := strings.Split(query, "&")
		for i, kv := range kvs {
			k, _, hasValue := strings.Cut(kv, "=")
			key, err := url.QueryUnescape(k)
			if err != nil {
				key = k
			}
			if hasValue && (strings.EqualFold(key, "password") || strings.EqualFold(key, "sslpassword")) {
				kvs[i] = k + "=" + mask
			}
		}
		rest = base + "?" + strings.Join(kvs, "&")
	}
	at := strings.LastIndexByte(rest, '@')
	switch c, slash := strings.IndexByte(rest, ':'), strings.IndexByte(rest, '/'); {
	case at < 0:
	case masked:
		rest = rest[at+1:] // the rest of a password with an '@' in it
	case !userinfo && c >= 0 && c < at && (slash < 0 || c < slash):
		// A password that a '/' cut from its userinfo (or a port followed
		// by an '@' in a parameter's value: hidden too).
		rest = rest[:c+1] + mask + rest[at:]
	}
	return head + rest
}

// Chain follows a ledger's hash chain line by line: each line must hold
// the record with the next seq whose prev is the SHA-256 of the line
// before, and a crc field that matches the line's bytes (after a line with
// one, every line must have one), as the runstate package documents the
// format. The zero Chain expects line 1. Not safe for concurrent use.
type Chain struct {
	Seq  int64  // the last record's seq
	Hash string // the hex SHA-256 of its line (without '\n')
	// CRC: the last record's line has a crc field, so the next must have
	// one too.
	CRC bool
}

// Next decodes line (a ledger line without its '\n') as the run's own
// reader does (runstate.DecodeLine: the exact keys, its crc), checks
// that it continues the chain, and advances. The error says what is
// wrong with the line; the caller adds where the line is and what to do.
// Not safe for concurrent use: it advances c.
func (c *Chain) Next(line []byte) (*runstate.Record, error) {
	r, has, err := runstate.DecodeLine(line)
	switch {
	case err != nil:
		return nil, err
	case c.CRC && !has:
		return nil, errors.New(`no "crc" field, though the line before has one (the field was damaged or removed?)`)
	}
	if r.Seq != c.Seq+1 || r.Prev != c.Hash {
		return nil, fmt.Errorf("seq %d does not continue the hash chain after seq %d", r.Seq, c.Seq)
	}
	c.Seq, c.Hash, c.CRC = r.Seq, lineHash(line), has
	return r, nil
}

// lineHash is the chain hash of a ledger line (without '\n').
func lineHash(line []byte) string {
	h := sha256.Sum256(line)
	return hex.EncodeToString(h[:])
}
