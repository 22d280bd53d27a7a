package pgstore

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
)

// Open creates the run named run, or resumes it, and starts a session on
// it: a *runstate.Run whose methods (Plan, Do, Begin, Effect, Approve …)
// behave as on a run directory, with the records in the database and the
// outputs in workDir, this machine's working directory (created when
// missing), their bytes also in the database so that a stage on another
// machine that depends on them (After) finds them. When Open returns, the
// session's open record (for a new run, the create record too) is
// committed, the create record durably. Open is safe for concurrent use:
// any number of goroutines, processes and machines may open one run at
// once; exactly one creates it and the others resume it, each as its own
// session.
//
// workDir also holds this machine's view of the run, as a run directory
// has its projections: logs/next-steps.txt and manifest.json, as of the
// last record this session saw (each names its seq), and at Close;
// next-steps.txt is rewritten within about 100 ms of each record (the Run
// renders the handoff at most every 50 ms, and its write waits up to
// 50 ms more: measured, 48 ms median and 94 ms at most), manifest.json
// when the Run renders one (at most every Options.ManifestInterval, on a
// record: an idle session's can be older); and logs/run.json, which
// names the run's address (no password), so that 'runstate status
// workDir' finds the run. They are views, never read back: the database
// is the truth.
//
// Open waits for locks (the run's, while another session has it alone;
// the run's head row, while another session's batch holds it) as long as
// ctx allows, and Options.LockTimeout when set: a wait that ctx ends fails
// with ctx's error (and runstate.ErrLockTimeout at its deadline), leaving
// no lock, no session and no record behind; so does a wait for a table's
// lock (LOCK TABLE, VACUUM FULL, a schema upgrade elsewhere) before the
// session holds the run, saying a statement waited. Once it holds it,
// the commit of its open record waits for such a lock without a bound
// (a commit is resolved, not abandoned).
//
// Open fails with runstate.ErrMismatch when the run serves another
// Request, as Open does for a directory, or when workDir is another
// run's working directory (its logs/run.json names another run: by name
// or schema, refused before the run is opened; by id alone, as when the
// run was made again under its name, refused before the session records
// anything) or is a run directory (it holds a logs/ledger.jsonl: a run
// kept in files, whose views this run's would overwrite), and
// with runstate.ErrInvalid for a run name that breaks the rule of stage
// names (valid UTF-8 of at most 256 bytes, no control character, no space
// at either end).
func (db *DB) Open(ctx context.Context, run, workDir string, opts *runstate.Options) (*runstate.Run, error) {
	if err := checkRunName(run); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if workDir == "" {
		return nil, fmt.Errorf("%w: pgstore: Open needs a working directory", runstate.ErrInvalid)
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, fmt.Errorf("pgstore: cannot create the working directory %s: %w", workDir, err)
	}
	if err := checkWorkDir(workDir, db.schema, run, nil); err != nil {
		return nil, err // before the run is opened: nothing recorded
	}
	// The views in workDir are the store's (ViewWorkDir, publish.go), and
	// the errors OpenStore's (an ErrMismatch names the run in the
	// database), as for a Run that runstate.OpenStore(db.Store(run), ...)
	// opened; ctx bounds the store's waits (Open, Lock).
	return runstate.OpenStoreContext(ctx, db.Store(run), workDir, opts)
}

// Inspect returns the status of the run named run as its records stand,
// read without a session or a lock (like runstate.Inspect): a stage shows
// as running until a record ends it, even when its session is gone (the
// next session that opens the run, or begins the stage, records it
// interrupted); db.Store(run).Live tells which sessions are gone. It
// writes nothing and is safe for concurrent use, also while sessions
// append.
func (db *DB) Inspect(ctx context.Context, run string) (st *runstate.Status, err error) {
	err = retryConn(ctx, func() error { // a read: again after a restart
		st, err = runstate.InspectStore(ctx, db.reader(run))
		return err
	})
	return st, err
}

// NextSteps returns the run's handoff text, rendered from its records as
// they stand; its commands name the run by its address (Address). It
// writes nothing and is safe for concurrent use.
func (db *DB) NextSteps(ctx context.Context, run string) (text string, err error) {
	err = retryConn(ctx, func() error {
		text, err = runstate.NextStepsStore(ctx, db.reader(run), db.Address(run))
		return err
	})
	return text, err
}

// ReadLedger calls fn with each record of the run, in order, the whole
// hash chain checked as it goes (like runstate.ReadLedger). It reads one
// snapshot of the records, takes no lock and is safe for concurrent use.
func (db *DB) ReadLedger(ctx context.Context, run string, fn func(*runstate.Record) error) error {
	called := false
	return retryUntil(ctx, &called, func() error {
		return runstate.ReadStore(ctx, db.reader(run), func(rec *runstate.Record) error {
			called = true
			return fn(rec)
		})
	})
}

// retryUntil is retryConn for a read that hands what it reads to its
// caller as it goes: tried again only while nothing was handed (*called
// is false), so that nothing is handed twice.
func retryUntil(ctx context.Context, called *bool, fn func() error) error {
	err := retryConn(ctx, func() error {
		err := fn()
		if err != nil && *called {
			return &handedError{err}
		}
		return err
	})
	if h, ok := err.(*handedError); ok {
		return h.err
	}
	return err
}

// handedError is a read's error after it handed its caller something:
// not to be tried again (retryUntil), whatever it is. It wraps nothing,
// so that isConnError does not see into it.
type handedError struct{ err error }

func (e *handedError) Error() string { return e.err.Error() }

// Export writes the run's records to w as a logs/ledger.jsonl: the exact
// lines, each with its '\n', in seq order, from one snapshot (so
// runstate.Verify and the runstate command read the file as they read a
// run directory's ledger). It writes nothing to the database and syncs
// nothing: on an error, w may hold part of the lines, the last one cut
// short. It takes no lock; safe for concurrent use (on different ws).
func (db *DB) Export(ctx context.Context, run string, w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	called := false
	err := retryUntil(ctx, &called, func() error {
		_, err := db.reader(run).Read(ctx, runstate.Position{}, func(line []byte) error {
			called = true
			if _, err := bw.Write(line); err != nil {
				return err
			}
			return bw.WriteByte('\n')
		})
		return err
	})
	if err != nil {
		return err
	}
	return bw.Flush()
}

// Verify checks the whole run (like runstate.Verify): every record's seq,
// hash chain and crc; that the run's head row names the last record; that
// every output's bytes are in the database, whole (every chunk there, the
// sizes right); with RehashBlobs, also that those bytes still hash to the
// sha256 each output names. It takes no lock and writes nothing; safe for
// concurrent use. The error is non-nil only when the records cannot be
// read; what is wrong is in Report.Problems.
func (db *DB) Verify(ctx context.Context, run string, opts ...VerifyOption) (*runstate.Report, error) {
	var o verifyOptions
	for _, opt := range opts {
		opt(&o)
	}
	var s runstate.Store = db.reader(run)
	if o.rehash {
		s = rehashing{db.reader(run)}
	}
	var rep *runstate.Report
	err := retryConn(ctx, func() (err error) {
		rep, err = runstate.VerifyStore(ctx, s, "")
		return err
	})
	if rep != nil {
		rep.Dir = db.Address(run)
	}
	return rep, err
}

// Runs returns the names of the runs in the schema, in order: those that
// hold a record. An Open refused before the run's first record (no
// Options.Request for a new run, a working directory of another run)
// leaves the name's row in the runs table, which the next Open of the
// name uses; it is not a run until that Open records. It reads one
// snapshot, writes nothing, and is safe for concurrent use.
func (db *DB) Runs(ctx context.Context) ([]string, error) {
	var names []string
	err := retryConn(ctx, func() error {
		rows, err := db.pool.Query(ctx, db.sql(`SELECT r.name FROM {s}.runs r WHERE `+hasRecord+` ORDER BY r.name`))
		if err != nil {
			return err
		}
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return nil, db.rightsError("list the runs of schema "+db.schema, err)
	}
	return names, nil
}

// hasRecord is the condition on a runs row r that makes it a run (Runs,
// Has): a record of its own.
const hasRecord = `EXISTS (SELECT 1 FROM {s}.records c WHERE c.run_id = r.id)`

// Has tells whether the schema holds the run named run: one that Runs
// lists, with a record (not the name's row an Open refused before the
// first record left). One indexed query, whatever the run's length: a
// program that must not create a run asks it before Open. It writes
// nothing and is safe for concurrent use.
func (db *DB) Has(ctx context.Context, run string) (bool, error) {
	if err := checkRunName(run); err != nil {
		return false, err
	}
	var has bool
	err := retryConn(ctx, func() error {
		return db.pool.QueryRow(ctx, db.sql(`SELECT EXISTS (SELECT 1 FROM {s}.runs r WHERE r.name = $1 AND `+hasRecord+`)`), run).Scan(&has)
	})
	if err != nil {
		return false, db.rightsError("read run "+run, err)
	}
	return has, nil
}

// Address is the run's address for the runstate command, without the
// password: postgres://USER@HOST:PORT/DATABASE?run=NAME, with schema=S
// for a schema other than runstate, the TLS settings and
// target_session_attrs as the DSN (or the environment: PGSSLMODE,
// PGSSLROOTCERT …) gave them (sslmode, sslrootcert, sslcert and sslkey,
// each path made absolute, sslsni; never sslpassword), every host of a
// list (HOST:PORT,HOST2:PORT2), and a Unix
// socket's directory and port as host=DIR&port=PORT: read back, it
// connects to the same server, database and user, the same way. It reads
// nothing from the server (the run need not exist). Safe for concurrent
// use.
func (db *DB) Address(run string) string {
	c := db.lockCfg
	u := url.URL{Scheme: "postgres", Path: "/" + c.Database}
	if c.User != "" {
		u.User = url.User(c.User)
	}
	var hosts, ports []string // the host list, as pgx tries it (Fallbacks: each host once per TLS try)
	socket := false
	add := func(host string, port uint16) {
		p := strconv.Itoa(int(port))
		if n := len(hosts); n > 0 && hosts[n-1] == host && ports[n-1] == p {
			return
		}
		hosts, ports = append(hosts, host), append(ports, p)
		socket = socket || strings.HasPrefix(host, "/")
	}
	add(c.Host, c.Port)
	for _, f := range c.Fallbacks {
		add(f.Host, f.Port)
	}
	q := url.Values{}
	if socket { // a directory cannot be a URL's host
		q.Set("host", strings.Join(hosts, ","))
		q.Set("port", strings.Join(ports, ","))
	} else {
		for i := range hosts {
			hosts[i] = net.JoinHostPort(hosts[i], ports[i])
		}
		u.Host = strings.Join(hosts, ",")
	}
	for _, kv := range db.addrParams {
		q.Set(kv[0], kv[1])
	}
	if db.schema != DefaultSchema {
		q.Set("schema", db.schema)
	}
	q.Set("run", run)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "%2F", "/") // a '/' needs no escape in a query: host=/var/run/postgresql
	// An '@' may stand unescaped in a URL's path, but Connect refuses a
	// DSN with one after the host (checkUserinfo: where the password
	// ends would be a guess), so a database's '@' is escaped.
	u.RawPath = strings.ReplaceAll(u.EscapedPath(), "@", "%40")
	return u.String()
}

// reader is the store of run for reading only.
func (db *DB) reader(run string) *store { return db.Store(run).(*store) }
