package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/runstate/runstate/cli"
	"github.com/runstate/runstate/pgstore"
	"github.com/runstate/runstate/pgstore/internal/dsnparam"
)

// pgSource is one run in a pgstore schema: the reads go through pgstore's
// DB (Inspect, NextSteps, ReadLedger, Verify) and the run's Store (Read,
// Live); Open opens a session with a temporary working directory.
type pgSource struct {
	addr string // the address without its password, for messages
	run  string
	db   *pgstore.DB
	work string // the operator session's working directory, once made
}

// pollEvery is how often log -follow reads the records after the last one
// it showed.
const pollEvery = 100 * time.Millisecond

// openPG connects to the database addr names and returns its run.
func openPG(ctx context.Context, addr string) (cli.Source, error) {
	dsn, run, err := splitRun(addr)
	if err != nil {
		return nil, err
	}
	// Read-only: a command never creates or upgrades the schema (the
	// operator commands' sessions need a run, so a schema, that exists).
	db, err := pgstore.ConnectReadOnly(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("runstate: %s: %w", cli.Redact(addr), err)
	}
	return &pgSource{addr: cli.Redact(addr), run: run, db: db}, nil
}

// runPG opens, for a pipeline command, a session on the run addr names
// with workDir as its working directory (cli.Runner). A working directory
// of another run is refused first, before anything connects. With
// opts.Request it connects with Connect, which creates or upgrades the
// schema, and DB.Open creates the run when it is not there; without, it
// connects read-only and the run must exist (checked before anything is
// written: a refused Open would leave the run's name behind). release
// closes the connection pool.
func runPG(ctx context.Context, addr, workDir string, opts *runstate.Options) (*runstate.Run, func(), error) {
	dsn, run, err := splitRun(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s", runstate.ErrInvalid, strings.TrimPrefix(err.Error(), "runstate: "))
	}
	if err := checkWorkDir(workDir, dsn, run); err != nil {
		return nil, nil, err
	}
	connect := pgstore.ConnectReadOnly
	if opts.Request != "" {
		connect = pgstore.Connect
	}
	db, err := connect(ctx, dsn)
	if errors.Is(err, pgstore.ErrNoRun) { // no schema: no run
		return nil, nil, fmt.Errorf("%w: %s: %v; give -request TEXT to create the run (and the schema)", runstate.ErrInvalid, cli.Redact(addr), err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("runstate: %s: %w", cli.Redact(addr), err)
	}
	src := &pgSource{addr: cli.Redact(addr), run: run, db: db}
	if opts.Request == "" {
		if _, err := db.Inspect(ctx, run); err != nil {
			defer db.Close()
			// No row, or the row of an Open refused before the run's
			// first record: no run either way.
			if errors.Is(err, pgstore.ErrNoRun) || errors.Is(err, fs.ErrNotExist) {
				return nil, nil, fmt.Errorf("%w: %s holds no run %q in schema %s (%s): give -request TEXT to create it", runstate.ErrInvalid, src.addr, run, db.Schema(), src.others())
			}
			return nil, nil, src.wrap(err)
		}
	}
	r, err := db.Open(ctx, run, workDir, opts)
	if err != nil {
		defer db.Close()
		return nil, nil, src.wrap(err)
	}
	return r, db.Close, nil
}

// checkWorkDir refuses workDir when its logs/run.json names another run
// than run in the schema dsn names (by name or schema, as DB.Open does),
// or one on another server or database, before Connect, which would
// create that schema first. A file that cannot be read names no run:
// DB.Open says what is wrong with it.
func checkWorkDir(workDir, dsn, run string) error {
	data, err := runstate.ReadWorkDirFile(workDir)
	if err != nil || data == nil {
		return nil
	}
	var rj struct{ Run, Schema, Address string }
	if json.Unmarshal(data, &rj) != nil || rj.Run == "" {
		return nil
	}
	_, query, _ := strings.Cut(dsn, "?")
	_, schema, _, err := dsnparam.Cut(query, "schema")
	if err != nil || schema == "" {
		schema = pgstore.DefaultSchema
	}
	if rj.Run == run && rj.Schema == schema {
		if there, here := serverOf(rj.Address), serverOf(dsn); there != "" && here != "" && there != here {
			return fmt.Errorf("%w: %s is the working directory of another run: its %s names run %q at %s (%s); this run is at %s: give each run a working directory of its own (if that is the same server under another name, leave out -at: the directory's %s names the run)",
				runstate.ErrMismatch, workDir, runstate.WorkDirFile, run, there, cli.Redact(rj.Address), here, runstate.WorkDirFile)
		}
		return nil
	}
	return fmt.Errorf("%w: %s is the working directory of another run: its %s names run %q in schema %s (%s); this run is %q in schema %s: give each run a working directory of its own",
		runstate.ErrMismatch, workDir, runstate.WorkDirFile, rj.Run, rj.Schema, cli.Redact(rj.Address), run, schema)
}

// serverOf is the servers and database an address or DSN names
// ("HOST:PORT,... /DATABASE"), as pgx reads it; "" when it does not parse.
func serverOf(addr string) string {
	dsn, _, err := cutRun(addr)
	if err != nil {
		return ""
	}
	base, query, _ := strings.Cut(dsn, "?")
	if rest, _, _, err := dsnparam.Cut(query, "schema"); err == nil {
		dsn = base
		if rest != "" {
			dsn += "?" + rest
		}
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return ""
	}
	hosts := []string{fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, fmt.Sprintf("%s:%d", f.Host, f.Port))
	}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	return strings.Join(hosts, ",") + "/" + cfg.Database
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
	if err != nil {
		return nil, nil, fmt.Errorf("runstate: %s: %w", cli.Redact(addr), err)
	}
	names := []string{run}
	if run == "" {
		if names, err = db.Runs(ctx); err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("runstate: %s: %w", cli.Redact(addr), err)
		}
	}
	srcs := make([]cli.Source, len(names))
	for i, name := range names {
		srcs[i] = &pgSource{addr: db.Address(name), run: name, db: db}
	}
	return srcs, db.Close, nil
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
		return fmt.Errorf("runstate: %s: %w; %s", s.addr, err, s.others())
	}
	return fmt.Errorf("runstate: %s: %w", s.addr, err)
}

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

func (s *pgSource) Inspect(ctx context.Context) (*runstate.Status, error) {
	st, err := s.db.Inspect(ctx, s.run)
	return st, s.wrap(err)
}

func (s *pgSource) NextSteps(ctx context.Context) (string, error) {
	text, err := s.db.NextSteps(ctx, s.run)
	return text, s.wrap(err)
}

// Handoff is the handoff rendered from the run's projection and the
// records after it: the database keeps no file that could lag.
func (s *pgSource) Handoff(ctx context.Context) (string, string, error) {
	text, err := s.NextSteps(ctx)
	return text, fmt.Sprintf("the handoff of run %s in schema %s", s.run, s.db.Schema()), err
}

func (s *pgSource) ReadLedger(ctx context.Context, fn func(*runstate.Record) error) error {
	return s.wrap(s.db.ReadLedger(ctx, s.run, fn))
}

func (s *pgSource) Verify(ctx context.Context) (*runstate.Report, error) {
	rep, err := s.db.Verify(ctx, s.run)
	return rep, s.wrap(err)
}

// VerifyBlobs is Verify that also rereads and rehashes every output's
// blob (verify -blobs).
func (s *pgSource) VerifyBlobs(ctx context.Context) (*runstate.Report, error) {
	rep, err := s.db.Verify(ctx, s.run, pgstore.RehashBlobs())
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

// lines calls fn with each record line after seq after, checking the
// chain from c (the state after seq after).
func (s *pgSource) lines(ctx context.Context, c *cli.Chain, fn func(line []byte, r *runstate.Record) error) error {
	_, err := s.db.Store(s.run).Read(ctx, runstate.Position{Seq: c.Seq}, func(line []byte) error {
		r, err := c.Next(line)
		if err != nil {
			return fmt.Errorf("runstate: %s: record %d: %v: the run's records are damaged; run 'runstate verify %s'", s.addr, c.Seq+1, err, s.addr)
		}
		return fn(line, r)
	})
	return s.wrap(err)
}

// Follow reads the records after the last one shown every pollEvery.
func (s *pgSource) Follow(ctx context.Context, after int64, fn func(*runstate.Record) error) error {
	var c cli.Chain
	if after > 0 { // the chain up to the last record shown
		err := s.lines(ctx, &c, func(_ []byte, r *runstate.Record) error {
			if r.Seq == after {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			return err
		}
	}
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		err := s.lines(ctx, &c, func(_ []byte, r *runstate.Record) error { return fn(r) })
		if err != nil && ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// errStop ends a read early.
var errStop = errors.New("stop")

func (s *pgSource) Export(ctx context.Context, w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 256<<10)
	var c cli.Chain
	var n int64
	err := s.lines(ctx, &c, func(line []byte, _ *runstate.Record) error {
		if _, err := bw.Write(line); err != nil {
			return err
		}
		n++
		return bw.WriteByte('\n')
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
	r, err := s.db.Open(ctx, s.run, s.work, opts)
	return r, s.wrap(err)
}

func (s *pgSource) Close() error {
	s.db.Close()
	if s.work != "" {
		return os.RemoveAll(s.work)
	}
	return nil
}
