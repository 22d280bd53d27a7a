package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/cli"
	"github.com/runstate/runstate/internal/escape"
	"github.com/runstate/runstate/pgstore"
	"github.com/runstate/runstate/pgstore/internal/dsnparam"
)

// pgSource is one run in a pgstore schema: the reads go through pgstore's
// DB (Inspect, NextSteps, ReadLedger, Verify) and the run's Store (Read,
// Live); Open opens a session with a temporary working directory.
type pgSource struct {
	addr string // the address without its password, for messages
	dsn  string // the address without run=NAME (RunID's, lockWatch's connections); never printed
	app  string // the connections' application_name (lockWatch)
	// said is the lock holders lockWatch has named, each once a command.
	said   map[int]bool
	saidMu sync.Mutex
	run    string
	db     *pgstore.DB
	work   string // the operator session's working directory, once made
	note   func(string)
}

// SetNote is cli.Noter: note prints on the command's standard error.
func (s *pgSource) SetNote(note func(string)) { s.note = note }

// say prints msg with note, if there is one.
func (s *pgSource) say(msg string) {
	if s.note != nil {
		s.note(msg)
	}
}

// pollEvery is how often log -follow reads the records after the last one
// it showed; retryEvery how often it tries again while the server does not
// answer.
const (
	pollEvery  = 100 * time.Millisecond
	retryEvery = time.Second
)

// noAnswer is how long log -follow waits for the server's next row, or the
// end of a read, before it takes the server for not answering (a backend
// stopped or hung, a server that accepts but never replies; the
// connection's keepalives still succeed then): it ends the read and tries
// again, as for a lost connection. The time its output takes (a paused
// pager) does not count.
const noAnswer = 10 * time.Second

// errNoAnswer ends a read that the server did not answer within noAnswer.
var errNoAnswer = fmt.Errorf("the server did not answer a read of the run's records within %v (a server or backend stopped or hung)", noAnswer)

// openPG connects to the database addr names and returns its run.
func openPG(ctx context.Context, addr string) (cli.Source, error) {
	dsn, run, err := splitRun(addr)
	if err != nil {
		return nil, err
	}
	dsn, app := withApp(dsn)
	// Read-only: a command never creates or upgrades the schema (the
	// operator commands' sessions need a run, so a schema, that exists).
	db, err := pgstore.ConnectReadOnly(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("runstate: %s: %w%s", cli.Redact(addr), err, timeoutAdvice(err))
	}
	return &pgSource{addr: cli.Redact(addr), dsn: dsn, app: app, run: run, db: db}, nil
}

// withApp names the command's connections (application_name) so that
// lockWatch can find them among the server's: "runstate command
// PID@HOST". It returns the address and the name, or the address as it
// is and "" when the address or PGAPPNAME names them already (lockWatch
// then watches nothing: other connections may have that name, and their
// waits are not this command's).
func withApp(dsn string) (string, string) {
	base, query, _ := strings.Cut(dsn, "?")
	if _, _, ok, err := dsnparam.Cut(query, "application_name"); err != nil || ok || os.Getenv("PGAPPNAME") != "" {
		return dsn, ""
	}
	host, _ := os.Hostname()
	app := fmt.Sprintf("runstate command %d@%s", os.Getpid(), host)
	if len(app) > 63 { // the server cuts a longer name
		app = app[:63]
	}
	if query != "" {
		query += "&"
	}
	return base + "?" + query + "application_name=" + strings.ReplaceAll(url.QueryEscape(app), "+", "%20"), app // pgx reads no '+' as a space
}

// lockNote is how long a read waits before lockWatch asks the server
// whether it waits for a lock, and then how often it asks again.
const lockNote = 3 * time.Second

// lockWatch runs read; while it has not returned, it asks the server
// every lockNote, on a connection of its own, whether one of this
// command's connections (s.app) waits for a lock, and says which server
// process holds it, once a holder in a command (firstSaid): a read
// behind a schema upgrade, a VACUUM FULL or a LOCK TABLE waited without
// a word. A read that is slow for any other reason (a long verify) says
// nothing.
func (s *pgSource) lockWatch(ctx context.Context, read func() error) error {
	if s.note == nil || s.app == "" {
		return read()
	}
	// wctx ends with the read: a question still connecting or waiting
	// (behind a pooler with no free connection) is dropped, not waited
	// for.
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(lockNote)
		defer tick.Stop()
		var conn *pgx.Conn // one connection for every question of this read
		defer func() {
			if conn != nil {
				conn.Close(context.WithoutCancel(wctx))
			}
		}()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			if conn == nil {
				cctx, cancel := context.WithTimeout(wctx, noAnswer)
				c, err := ownConn(cctx, s.dsn)
				cancel()
				if err != nil {
					continue
				}
				conn = c
			}
			h, err := s.lockHolder(wctx, conn)
			if err != nil {
				conn.Close(context.WithoutCancel(wctx))
				conn = nil
				continue
			}
			if h.pid == 0 || wctx.Err() != nil || !s.firstSaid(h.pid) { // the read ended: the next one may say it
				continue
			}
			s.say(fmt.Sprintf("runstate: %s: this command waits for a lock that server process %d holds (%s): it goes on when that transaction ends; Ctrl-C stops this command", s.addr, h.pid, h.what))
		}
	}()
	err := read()
	stop()
	wg.Wait()
	return err
}

// firstSaid reports whether holder pid is yet to be named, and counts it
// named.
func (s *pgSource) firstSaid(pid int) bool {
	s.saidMu.Lock()
	defer s.saidMu.Unlock()
	if s.said[pid] {
		return false
	}
	if s.said == nil {
		s.said = map[int]bool{}
	}
	s.said[pid] = true
	return true
}

// holder is a server process that holds a lock another waits for.
type holder struct {
	pid  int
	what string // who and what, for the note
}

// lockHolder asks the server on conn, within noAnswer, for a process
// that holds a lock one of this command's connections waits for
// (pg_blocking_pids), one that is not waiting for a lock itself first
// (a queued ALTER TABLE waits too); a zero holder when none waits.
func (s *pgSource) lockHolder(ctx context.Context, conn *pgx.Conn) (holder, error) {
	ctx, cancel := context.WithTimeout(ctx, noAnswer)
	defer cancel()
	var h holder
	var user, app, state, query string
	var secs int64
	err := conn.QueryRow(ctx, `SELECT b.pid, coalesce(b.usename::text, ''), coalesce(b.application_name, ''), coalesce(b.state, ''), coalesce(left(b.query, 200), ''),
	  coalesce(extract(epoch FROM now() - b.xact_start)::bigint, 0)
	FROM pg_stat_activity a CROSS JOIN LATERAL unnest(pg_blocking_pids(a.pid)) AS w(pid) JOIN pg_stat_activity b ON b.pid = w.pid
	WHERE a.application_name = $1 AND a.pid <> pg_backend_pid() ORDER BY b.wait_event_type IS NOT DISTINCT FROM 'Lock' LIMIT 1`, s.app).Scan(&h.pid, &user, &app, &state, &query, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return holder{}, nil
	} else if err != nil {
		return holder{}, err
	}
	h.what = fmt.Sprintf("user %q, application %q, %s, its transaction open %ds, its last query %q; SELECT pg_cancel_backend(%d) cancels a query it runs, pg_terminate_backend(%d) ends it", user, app, state, secs, query, h.pid, h.pid)
	return h, nil
}

// RunID is cli.RunIdentifier: the id of the run (its create record's), ""
// when the schema holds no run of that name, read on a connection of its
// own (schemaAt) with queries any version of the schema answers; a wait
// for a lock is said, as the reads' (lockWatch).
func (s *pgSource) RunID(ctx context.Context) (string, error) {
	var id string
	err := s.lockWatch(ctx, func() (err error) { _, id, err = schemaAt(ctx, s.dsn, s.db.Schema(), s.run); return err })
	if err != nil {
		return "", fmt.Errorf("runstate: %s: reading the run's id: %w%s", s.addr, err, timeoutAdvice(err))
	}
	return id, nil
}

// runPG opens, for a pipeline command, a session on the run addr names
// with workDir as its working directory (cli.Runner). What is refused is
// refused before anything is written: a working directory that DB.Open
// would refuse (pgstore.CheckWorkDir), before connecting; one whose
// logs/run.json names a run that is not at this address (another server
// or database: the run's id decides, not how the host is spelt); and,
// without opts.Request, a run that is not there (a refused Open would
// leave its name behind). It connects read-only; with opts.Request, where
// the schema is missing or older, with Connect, which creates or upgrades
// it, and DB.Open creates the run when it is not there. release closes
// the connection pool.
func runPG(ctx context.Context, addr, workDir string, opts *runstate.Options) (*runstate.Run, func(), error) {
	dsn, run, err := splitRun(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s", runstate.ErrInvalid, strings.TrimPrefix(err.Error(), "runstate: "))
	}
	name := cli.Redact(addr)
	_, query, _ := strings.Cut(dsn, "?")
	_, schema, _, err := dsnparam.Cut(query, "schema")
	if err != nil || schema == "" {
		schema = pgstore.DefaultSchema
	}
	if err := pgstore.CheckWorkDir(workDir, schema, run); err != nil {
		return nil, nil, fmt.Errorf("runstate: %s: %w%s", name, err, timeoutAdvice(err))
	}
	own := workDirRun(workDir)
	// gone is the refusal for a directory whose run (own) is not at this
	// address (what: "no schema S", "no run R in schema S"): another
	// server or database, or a schema or run that was dropped. Nothing
	// is written.
	gone := func(what string) error {
		rj := filepath.Join(workDir, filepath.FromSlash(runstate.WorkDirFile))
		if opts.Request == "" {
			return fmt.Errorf("%w: %s holds %s, and %s names run %q (id %s) at %s for this directory: if that run is gone, remove %s and give -request TEXT to create it anew; if it is kept elsewhere, give its address with -at (or none)",
				runstate.ErrInvalid, name, what, rj, run, own.ID, cli.Redact(own.Address), rj)
		}
		return fmt.Errorf("%w: %s holds %s, and %s names run %q (id %s) at %s for this directory: -request would create the run anew here, with another id; if that run is gone, remove %s first; if it is kept elsewhere, give its address with -at (or none)",
			runstate.ErrMismatch, name, what, rj, run, own.ID, cli.Redact(own.Address), rj)
	}
	noRun := fmt.Sprintf("no run %q in schema %s", run, schema)
	dsn, app := withApp(dsn)
	db, err := pgstore.ConnectReadOnly(ctx, dsn)
	switch {
	case err == nil:
	case errors.Is(err, pgstore.ErrNoRun) && own.ID != "": // no schema here
		return nil, nil, gone("no schema " + schema)
	case errors.Is(err, pgstore.ErrNoRun) && opts.Request == "":
		return nil, nil, fmt.Errorf("%w: %s: %v; to create the run there (and pgstore's tables in schema %s), give -request TEXT", runstate.ErrInvalid, name, err, schema)
	case errors.Is(err, runstate.ErrVersion):
		// Only an older schema is upgraded (by -request), and only when
		// the directory's run is in it, or the directory names none
		// (queries any version answers).
		v, id, ierr := schemaAt(ctx, dsn, schema, run)
		switch {
		case ierr != nil:
			return nil, nil, fmt.Errorf("runstate: %s: %w (and reading schema %s's version: %v)", name, err, schema, ierr)
		case v <= 0 || v >= pgstore.SchemaVersion: // newer, or no version: no upgrade helps
			return nil, nil, fmt.Errorf("runstate: %s: %w%s", name, err, timeoutAdvice(err))
		case opts.Request == "":
			return nil, nil, fmt.Errorf("runstate: %s: %w; a pipeline command upgrades it when given -request TEXT (the run's request)", name, err)
		case own.ID != "" && id != own.ID:
			return nil, nil, gone(noRun)
		}
		db, err = pgstore.Connect(ctx, dsn)
	case opts.Request != "" && errors.Is(err, pgstore.ErrNoRun):
		db, err = pgstore.Connect(ctx, dsn)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("runstate: %s: %w%s", name, err, timeoutAdvice(err))
	}
	// A pipeline command's notes go where the command's do (cli's notef).
	src := &pgSource{addr: name, dsn: dsn, app: app, run: run, db: db, note: func(msg string) { fmt.Fprintln(os.Stderr, escape.Page(msg)) }}
	if opts.Request == "" || own.ID != "" {
		// No row, or the row of an Open refused before the run's first
		// record: no run either way (Has; not an Inspect, which would
		// read the whole run).
		var has bool
		err := src.lockWatch(ctx, func() (err error) { has, err = db.Has(ctx, run); return err })
		switch {
		case err != nil:
			defer db.Close()
			return nil, nil, src.wrap(err)
		case !has && own.ID != "":
			defer db.Close()
			return nil, nil, gone(noRun)
		case !has:
			defer db.Close()
			return nil, nil, fmt.Errorf("%w: %s holds no run %q in schema %s (%s): give -request TEXT to create it", runstate.ErrInvalid, name, run, db.Schema(), src.others())
		}
		// Another id under the name (the run made again): DB.Open
		// refuses the directory before recording anything.
	}
	var r *runstate.Run
	err = src.lockWatch(ctx, func() (err error) { r, err = db.Open(ctx, run, workDir, opts); return err })
	if err != nil {
		defer db.Close()
		return nil, nil, src.wrap(err)
	}
	return r, db.Close, nil
}

// ownConn connects to dsn (an address without run=NAME; its schema=NAME
// left out) outside pgstore's pools, within 10 s when the address sets
// no connect_timeout.
func ownConn(ctx context.Context, dsn string) (*pgx.Conn, error) {
	base, query, _ := strings.Cut(dsn, "?")
	rest, _, _, err := dsnparam.Cut(query, "schema")
	if err != nil {
		return nil, err
	}
	if rest != "" {
		base += "?" + rest
	}
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		return nil, err
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// schemaAt reads, on a connection of its own and with queries any
// version of pgstore's schema answers (schema_version, runs(id, name) and
// records(run_id, seq, line) are in its first), the version of schema at
// dsn (0 when it has none) and the id of run there: its create record's,
// as a working directory's logs/run.json names it ("" when the run has no
// record there).
func schemaAt(ctx context.Context, dsn, schema, run string) (version int, id string, err error) {
	conn, err := ownConn(ctx, dsn)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{schema}.Sanitize()
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+ident+".schema_version").Scan(&version); err != nil {
		return 0, "", err
	}
	var line []byte
	err = conn.QueryRow(ctx, "SELECT r.line FROM "+ident+".records r JOIN "+ident+".runs u ON r.run_id = u.id WHERE u.name = $1 AND r.seq = 1", run).Scan(&line)
	if errors.Is(err, pgx.ErrNoRows) {
		return version, "", nil
	} else if err != nil {
		return version, "", err
	}
	rec, _, err := runstate.DecodeLine(line)
	if err != nil {
		return version, "", fmt.Errorf("run %q's first record: %w", run, err)
	}
	var create struct{ ID string }
	if err := json.Unmarshal(rec.Data, &create); err != nil {
		return version, "", fmt.Errorf("run %q's first record: %w", run, err)
	}
	return version, create.ID, nil
}

// workDirRun is what workDir's logs/run.json says of its run (the zero
// value when it says nothing: pgstore.CheckWorkDir refused what cannot
// be read).
func workDirRun(workDir string) (rj struct{ Run, Schema, Address, ID string }) {
	data, err := runstate.ReadWorkDirFile(workDir)
	if err != nil || data == nil || json.Unmarshal(data, &rj) != nil {
		return rj
	}
	return rj
}

// listPG lists, for ls, the runs of the database and schema addr names,
// or the one run it names with run=NAME: one read-only connection pool
// for them all, closed by the returned function. Each run's Source is
// named by its address (DB.Address), which the other commands take.
func listPG(ctx context.Context, addr string) ([]cli.Source, func(), error) {
	dsn, run, err := cutRun(addr)
	if err != nil {
		return nil, nil, err
	}
	db, err := pgstore.ConnectReadOnly(ctx, dsn)
	if err != nil && run == "" && errors.Is(err, pgstore.ErrNoRun) {
		// No schema, so no runs to list: ErrNoRun's own words ("no
		// such run") would read as if the address named one.
		return nil, nil, fmt.Errorf("runstate: %s: %s", cli.Redact(addr), strings.TrimPrefix(err.Error(), pgstore.ErrNoRun.Error()+": "))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("runstate: %s: %w%s", cli.Redact(addr), err, timeoutAdvice(err))
	}
	names := []string{run}
	if run == "" {
		if names, err = db.Runs(ctx); err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("runstate: %s: %w%s", cli.Redact(addr), err, timeoutAdvice(err))
		}
	}
	srcs := make([]cli.Source, len(names))
	for i, name := range names {
		srcs[i] = &pgSource{addr: db.Address(name), run: name, db: db}
	}
	return srcs, func() { closeSoon(db) }, nil
}

// LastRecord is the time of record seq, the run's last (ls): one line
// read.
func (s *pgSource) LastRecord(ctx context.Context, seq int64) (time.Time, error) {
	if seq <= 0 {
		return time.Time{}, nil
	}
	var at time.Time
	_, err := s.db.Store(s.run).Read(ctx, runstate.Position{Seq: seq - 1}, func(line []byte) error {
		rec, _, err := runstate.DecodeLine(line)
		if err != nil {
			return err
		}
		at = rec.At
		return errStop
	})
	if err != nil && !errors.Is(err, errStop) {
		return time.Time{}, err
	}
	return at, nil
}

// splitRun removes the run parameter from a postgres:// address and
// returns the DSN left (schema, if any, stays: pgstore.Connect takes it)
// and the run's name; an address that names no run is an error saying
// how to name one.
func splitRun(addr string) (dsn, run string, err error) {
	dsn, run, err = cutRun(addr)
	if err == nil && run == "" {
		example := dsn + "?"
		if strings.Contains(dsn, "?") {
			example = dsn + "&"
		}
		return "", "", fmt.Errorf("runstate: %s names no run: add ?run=NAME, the name the agents open (e.g. %srun=billing-2026-11-29)", cli.Redact(addr), cli.Redact(example))
	}
	return dsn, run, err
}

// cutRun is splitRun for an address that may name no run (ls lists a
// database's runs): run is then "". The scheme comes back in lower case
// (POSTGRES:// is postgres://, as the command matched it), which pgx
// needs to read the DSN as a URL.
func cutRun(addr string) (dsn, run string, err error) {
	if scheme, rest, ok := strings.Cut(addr, "://"); ok {
		addr = strings.ToLower(scheme) + "://" + rest
	}
	base, query, _ := strings.Cut(addr, "?")
	rest, run, _, err := dsnparam.Cut(query, "run")
	switch {
	case errors.Is(err, dsnparam.ErrTwice):
		return "", "", fmt.Errorf("runstate: %s names two runs: give run=NAME once", cli.Redact(addr))
	case err != nil:
		return "", "", fmt.Errorf("runstate: %s: the run parameter: %w", cli.Redact(addr), err)
	case rest != "":
		base += "?" + rest
	}
	return base, run, nil
}

func (s *pgSource) Name() string { return s.addr }

func (s *pgSource) Ledger() string {
	return fmt.Sprintf("table %s.records, run %s", s.db.Schema(), s.run)
}

// wrap adds the address to err and, for a run that is not there, the
// runs that are.
func (s *pgSource) wrap(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgstore.ErrNoRun) {
		return &addrError{addr: s.addr, err: err, more: "; " + s.others()}
	}
	return &addrError{addr: s.addr, err: err, more: timeoutAdvice(err)}
}

// timeoutAdvice is what to do when the server's statement_timeout (a
// user's, a database's, the server's) ended one of the command's
// statements, as it ends the read of a long run: "" for another error.
// The address passes the parameter to the server, for the command's
// connections alone.
//
// A statement ended by the timer may be reported as "canceling statement
// due to user request" (the server's timer and the statement's end race,
// seen with statement_timeout=1 on a busy machine), which is also what
// pg_cancel_backend or a client's cancel gives: the advice then names both.
func timeoutAdvice(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "57014" {
		return ""
	}
	const fix = "add statement_timeout=0 (or a longer time, in ms) to the address, which sets it for this command's connections alone"
	switch {
	case strings.Contains(pe.Message, "statement timeout"):
		return "; the server's statement_timeout (set for this user, the database or the server) ended it: " + fix
	case strings.Contains(pe.Message, "user request"):
		return "; the server canceled it: a statement_timeout set for this user, the database or the server (which the server may report so), or someone's pg_cancel_backend: for the first, " + fix
	}
	return ""
}

// addrError is err about the run at addr: "runstate: ADDR: " and err's
// text, without the "runstate: " the library's own errors begin with
// (once is enough), then more.
type addrError struct {
	addr string
	err  error
	more string
}

func (e *addrError) Error() string {
	return "runstate: " + e.addr + ": " + strings.TrimPrefix(e.err.Error(), "runstate: ") + e.more
}

func (e *addrError) Unwrap() error { return e.err }

// others says which runs the schema holds, for a run name that is not
// among them.
func (s *pgSource) others() string {
	names, err := s.db.Runs(context.Background())
	switch {
	case err != nil:
		return "check run=NAME and schema=NAME in the address"
	case len(names) == 0:
		return fmt.Sprintf("schema %s holds no run: check schema=NAME in the address", s.db.Schema())
	case len(names) > 10:
		return fmt.Sprintf("the runs in schema %s include %s ... (%d in all)", s.db.Schema(), strings.Join(names[:10], ", "), len(names))
	}
	return fmt.Sprintf("the runs in schema %s: %s", s.db.Schema(), strings.Join(names, ", "))
}

func (s *pgSource) Inspect(ctx context.Context) (st *runstate.Status, err error) {
	err = s.lockWatch(ctx, func() error { st, err = s.db.Inspect(ctx, s.run); return err })
	return st, s.wrap(err)
}

func (s *pgSource) NextSteps(ctx context.Context) (text string, err error) {
	err = s.lockWatch(ctx, func() error { text, err = s.db.NextSteps(ctx, s.run); return err })
	return text, s.wrap(err)
}

// Handoff is the handoff rendered from the run's projection and the
// records after it: the database keeps no file that could lag.
func (s *pgSource) Handoff(ctx context.Context) (string, string, error) {
	text, err := s.NextSteps(ctx)
	return text, fmt.Sprintf("the handoff of run %s in schema %s", s.run, s.db.Schema()), err
}

func (s *pgSource) ReadLedger(ctx context.Context, fn func(*runstate.Record) error) error {
	return s.wrap(s.lockWatch(ctx, func() error { return s.db.ReadLedger(ctx, s.run, fn) }))
}

func (s *pgSource) Verify(ctx context.Context) (rep *runstate.Report, err error) {
	err = s.lockWatch(ctx, func() error { rep, err = s.db.Verify(ctx, s.run); return err })
	return rep, s.wrap(err)
}

// VerifyBlobs is Verify that also rereads and rehashes every output's
// blob (verify -blobs).
func (s *pgSource) VerifyBlobs(ctx context.Context) (rep *runstate.Report, err error) {
	err = s.lockWatch(ctx, func() error { rep, err = s.db.Verify(ctx, s.run, pgstore.RehashBlobs()); return err })
	return rep, s.wrap(err)
}

func (s *pgSource) VerifyChecks() string {
	return "and so do the store's own checks (the run's head row, every output's bytes)"
}

// Alive asks pg_locks whether each session's advisory lock is held; it
// takes no lock. When the server cannot tell, every session is alive.
func (s *pgSource) Alive(ctx context.Context, sessions []string) map[string]bool {
	live, err := s.db.Store(s.run).Live(ctx, sessions)
	if err != nil {
		live = make(map[string]bool, len(sessions))
		for _, id := range sessions {
			live[id] = true
		}
	}
	return live
}

// Unsure says, of sessions that Alive took for alive, those it could not
// tell: for a server that restarted less than pgstore's grace ago, the
// sessions that held their locks before the restart and have not taken
// them again (reconnecting, or dead with the server), with when it can
// tell (cli's unsurer). None when the server cannot be asked.
func (s *pgSource) Unsure(sessions []string) map[string]error {
	g, err := s.db.RestartGrace(context.Background(), sessions)
	if err != nil || g == nil {
		return nil
	}
	why := make(map[string]error, len(g.Sessions))
	for _, id := range g.Sessions {
		why[id] = &graceError{ago: g.Ago, left: g.Left}
	}
	return why
}

// graceError is why status cannot tell whether a session is alive: the
// server restarted ago, and for left more a session that held its lock
// before may still take it again. Action is what to do (cli reads it).
type graceError struct{ ago, left time.Duration }

func (e *graceError) Error() string {
	return fmt.Sprintf("the server restarted %s ago, and a session that held its lock before has %s from the restart to take it again: it is known alive or gone at %s UTC",
		secs(e.ago), secs(e.ago+e.left), time.Now().Add(e.left).UTC().Format(time.TimeOnly))
}

func (e *graceError) Action() string {
	return fmt.Sprintf("run status again in %s, when the session is known alive or gone (a stage it began is then shown running or interrupted)", secs(e.left))
}

// secs is d in whole seconds, rounded up ("1 s" for less).
func secs(d time.Duration) string {
	return fmt.Sprintf("%d s", (d+time.Second-1)/time.Second)
}

// lines calls fn with each record line after seq after, checking the
// chain from c (the state after seq after).
func (s *pgSource) lines(ctx context.Context, c *cli.Chain, fn func(line []byte, r *runstate.Record) error) error {
	_, err := s.db.Store(s.run).Read(ctx, runstate.Position{Seq: c.Seq}, func(line []byte) error {
		r, err := c.Next(line)
		if err != nil {
			// wrap names the address; the advice quotes it for a shell
			// (its & would end the command).
			return fmt.Errorf("record %d: %v: the run's records are damaged; runstate verify %s lists every problem", c.Seq+1, err, escape.Arg(s.addr))
		}
		return fn(line, r)
	})
	return s.wrap(err)
}

// watched is lines with a watchdog: when the server sends no row, nor the
// read's end, for noAnswer while the read waits on it, the read is ended
// (pgx drops its connection) with an error wrapping errNoAnswer. The time
// fn takes does not count.
func (s *pgSource) watched(ctx context.Context, c *cli.Chain, fn func(line []byte, r *runstate.Record) error) error {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dog := time.AfterFunc(noAnswer, func() { cancel(errNoAnswer) })
	defer dog.Stop()
	err := s.lines(wctx, c, func(line []byte, r *runstate.Record) error {
		if !dog.Stop() {
			return errNoAnswer
		}
		err := fn(line, r)
		dog.Reset(noAnswer)
		return err
	})
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(wctx), errNoAnswer) {
		return &addrError{addr: s.addr, err: errNoAnswer}
	}
	return err
}

// Follow reads the records after the last one shown every pollEvery.
// While the server does not answer (a restart, a connection ended by
// pg_terminate_backend or a failover, a read left unanswered for
// noAnswer), it says so once and tries again
// every retryEvery, then says when it answers again and goes on after the
// last record shown: nothing is shown twice or left out.
func (s *pgSource) Follow(ctx context.Context, after int64, fn func(*runstate.Record) error) error {
	var c cli.Chain
	caught := after <= 0 // c holds the chain up to the last record shown
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var down time.Time // when the last read failed for want of the server; zero while it answers
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if !down.IsZero() && time.Since(down) < retryEvery {
			continue
		}
		up := func(seq int64) { // the server answers again: said before what it shows
			if !down.IsZero() {
				s.say(fmt.Sprintf("runstate: %s: the server answers again: following the run after seq %d", s.addr, seq))
				down = time.Time{}
			}
		}
		var err error
		if !caught { // read, not shown, up to after
			err = s.watched(ctx, &c, func(_ []byte, r *runstate.Record) error {
				if r.Seq == after {
					return errStop
				}
				return nil
			})
			if err == nil || errors.Is(err, errStop) {
				caught, err = true, nil
			}
		}
		if caught {
			err = s.watched(ctx, &c, func(_ []byte, r *runstate.Record) error {
				up(r.Seq - 1)
				return fn(r)
			})
		}
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil && connLost(err):
			if down.IsZero() {
				s.say(fmt.Sprintf("%v; runstate log -follow tries again every %v until the server answers (Ctrl-C stops it)", err, retryEvery))
			}
			down = time.Now()
		case err != nil:
			return err
		default:
			up(c.Seq)
		}
	}
}

// connLost reports whether err is a connection to the server that failed
// or could not be made (a server stopped or restarting, a backend
// terminated), not an answer of the server's.
func connLost(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) { // 08: connection exception; 57P: operator intervention (shutdown, terminated, starting up)
		return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
	}
	return errors.Is(err, errNoAnswer) || errors.As(err, new(*pgconn.ConnectError)) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.As(err, new(net.Error)) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

// errStop ends a read early.
var errStop = errors.New("stop")

func (s *pgSource) Export(ctx context.Context, w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	var c cli.Chain
	var n int64
	err := s.lockWatch(ctx, func() error {
		return s.lines(ctx, &c, func(line []byte, _ *runstate.Record) error {
			if _, err := bw.Write(line); err != nil {
				return err
			}
			n++
			return bw.WriteByte('\n')
		})
	})
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	return n, err
}

// Open opens a session on the run with a working directory of its own
// (the operator commands write no outputs), removed by Close.
func (s *pgSource) Open(ctx context.Context, opts *runstate.Options) (*runstate.Run, error) {
	if s.work == "" {
		dir, err := os.MkdirTemp("", "runstate-operator-")
		if err != nil {
			return nil, err
		}
		s.work = dir
	}
	var r *runstate.Run
	err := s.lockWatch(ctx, func() (err error) { r, err = s.db.Open(ctx, s.run, s.work, opts); return err })
	return r, s.wrap(err)
}

func (s *pgSource) Close() error {
	closeSoon(s.db)
	if s.work != "" {
		return os.RemoveAll(s.work)
	}
	return nil
}

// closeWait is how long closeSoon waits for the pool to close.
const closeWait = time.Second

// closeSoon closes db, waiting at most closeWait: a read ended because
// the server did not answer (log -follow's noAnswer, Ctrl-C) leaves pgx
// waiting up to 15 s for that connection's server to hang up, which the
// command, about to exit, need not. The rest of the close goes on while
// the process lives.
func closeSoon(db *pgstore.DB) {
	done := make(chan struct{})
	go func() {
		db.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(closeWait):
	}
}
