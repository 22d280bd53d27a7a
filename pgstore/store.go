package pgstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
)

// store is one run's records in the database: the runstate.Store that
// OpenStore drives. A store from Store(run) that was never opened reads
// only (Inspect, the CLI): it holds no session and takes no lock.
type store struct {
	db   *DB
	name string // the run's name (runs.name)

	mu    sync.Mutex
	runID string   // runs.id, once known
	ses   *session // nil until Open, and for readers
	// used: Open was called (a store serves one Run); refused counts the
	// Opens it refused for that, whose Close (runstate.OpenStore's
	// cleanup) must leave the Run's session alone.
	used    bool
	refused int
	blobs   *blobStore
	pub     published // projections not yet written (Batch.Publish)
	opt     optimism  // whether the next batch may skip the lock (optimistic.go)
	ahead   ahead     // the pipeline of a session alone on its run (ahead.go)
}

// Store returns the runstate.Store of the run named run, for
// runstate.OpenStore and the store-generic readers (and the conformance
// suite). Nothing is read or written until it is used. It is safe for
// concurrent use; one store serves one Run: a second OpenStore of it
// fails with runstate.ErrInvalid and leaves the first Run as it was (call
// Store again for each Run).
// runstate.OpenStore(db.Store(run), workDir, opts) is DB.Open without its
// checks of the arguments: the same session, and the same views in workDir
// (a runstate.WorkDirViewer: logs/next-steps.txt, manifest.json,
// logs/run.json).
func (db *DB) Store(run string) runstate.Store {
	s := &store{db: db, name: run}
	s.blobs = &blobStore{db: db, s: s}
	s.pub.write = func() { s.writeKept(false) } // publish.go
	return s
}

// Open creates the run's row when it is missing (exactly one creator among
// racing sessions: INSERT ... ON CONFLICT DO NOTHING), takes the session's
// lock and returns the newest projection that still matches the records.
func (s *store) Open(ctx context.Context, session string) ([]byte, runstate.Position, error) {
	s.mu.Lock()
	used := s.used
	if used {
		s.refused++
	}
	s.used = true
	s.mu.Unlock()
	if used {
		return nil, runstate.Position{}, fmt.Errorf("%w: pgstore: %s: this Store value was opened already (one Store value serves one Run, once): call db.Store(%q) again for another Run, or use db.Open", runstate.ErrInvalid, s, s.name)
	}
	if err := checkRunName(s.name); err != nil {
		return nil, runstate.Position{}, err
	}
	if _, err := uuid.Parse(session); err != nil {
		return nil, runstate.Position{}, fmt.Errorf("pgstore: session id %q is not a UUID", session)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, runstate.Position{}, err
	}
	if _, err := s.db.pool.Exec(ctx, s.db.sql(`INSERT INTO {s}.runs (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`),
		id.String(), s.name); err != nil {
		return nil, runstate.Position{}, s.db.rightsError("open run "+s.name+" for writing", err) // its row is made when missing
	}
	runID, err := s.id(ctx)
	if err != nil {
		return nil, runstate.Position{}, err
	}
	ses, err := s.db.hold(ctx, runID, session, s.stopAhead, s.lostAhead)
	if err != nil {
		return nil, runstate.Position{}, err
	}
	snap, at, err := s.snapshot(ctx, runID)
	if err != nil {
		ses.close(true)
		return nil, runstate.Position{}, err
	}
	ses.since = at.Seq
	s.mu.Lock()
	s.ses = ses
	s.mu.Unlock()
	return snap, at, nil
}

// id returns the run's id: ErrNoRun when the run does not exist.
func (s *store) id(ctx context.Context) (string, error) {
	s.mu.Lock()
	id := s.runID
	s.mu.Unlock()
	if id != "" {
		return id, nil
	}
	if err := checkRunName(s.name); err != nil {
		return "", err
	}
	err := s.db.pool.QueryRow(ctx, s.db.sql(`SELECT id::text FROM {s}.runs WHERE name = $1`), s.name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: no run %q in schema %s of %s", ErrNoRun, s.name, s.db.schema, s.db.where)
	} else if err != nil {
		return "", s.db.rightsError("read run "+s.name, err)
	}
	s.mu.Lock()
	s.runID = id
	s.mu.Unlock()
	return id, nil
}

// ErrNoRun is wrapped by the errors of the readers (Inspect, Export …) for
// a run name the schema does not hold, and by ConnectReadOnly's for a
// missing schema.
var ErrNoRun = errors.New("pgstore: no such run")

// snapshot reads the projection whose record is still in the records
// table with the same hash.
func (s *store) snapshot(ctx context.Context, runID string) ([]byte, runstate.Position, error) {
	var snap, hash []byte
	var at runstate.Position
	err := s.db.pool.QueryRow(ctx, s.db.sql(`SELECT p.manifest, p.seq, p.hash, p."end", p.last_len, p.crc FROM {s}.projections p
		JOIN {s}.records r ON r.run_id = p.run_id AND r.seq = p.seq AND r.hash = p.hash WHERE p.run_id = $1`), runID).
		Scan(&snap, &at.Seq, &hash, &at.End, &at.LastLen, &at.CRC)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, runstate.Position{}, nil
	} else if err != nil {
		return nil, runstate.Position{}, s.db.rightsError("read the projection of run "+s.name, err)
	}
	if len(snap) == 0 {
		return nil, runstate.Position{}, nil
	}
	at.Hash = hex.EncodeToString(hash)
	return snap, at, nil
}

// Read calls fn with each record's line after from, in order, from one
// snapshot of the table, without any lock. fn must not keep line.
func (s *store) Read(ctx context.Context, from runstate.Position, fn func(line []byte) error) (int64, error) {
	runID, err := s.id(ctx)
	if err != nil {
		return 0, err
	}
	rows, err := s.db.pool.Query(ctx, s.db.sql(`SELECT seq, line FROM {s}.records WHERE run_id = $1 AND seq > $2 ORDER BY seq`), runID, from.Seq)
	if err != nil {
		return 0, s.db.rightsError("read the records of run "+s.name, err)
	}
	defer rows.Close()
	want := from.Seq + 1
	for rows.Next() {
		var seq int64
		var line []byte
		if err := rows.Scan(&seq, &line); err != nil {
			return 0, err
		}
		if seq != want {
			return 0, fmt.Errorf("pgstore: run %s: record %d is missing from %s.records (seq jumps to %d)", s.name, want, s.db.schema, seq)
		}
		want++
		if err := fn(line); err != nil {
			return 0, err
		}
	}
	if err := rows.Err(); err != nil {
		return 0, s.db.rightsError("read the records of run "+s.name, err)
	}
	return 0, nil // a transaction cannot tear a line
}

// Live reports, for each session, whether its lock or its pipeline key
// (ahead.go) is held, from pg_locks: no lock is taken. Within the restart
// grace a session that opened before the restart is alive (it may be
// reconnecting).
func (s *store) Live(ctx context.Context, sessions []string) (map[string]bool, error) {
	keys := make([]int64, len(sessions))
	pipes := make([]int64, len(sessions))
	for i, id := range sessions {
		keys[i], pipes[i] = lockKey(id), pipeKey(id)
	}
	rows, err := s.db.pool.Query(ctx, s.db.sql(`SELECT k, (now() - pg_postmaster_start_time() < $3::interval
		AND EXISTS (SELECT 1 FROM {s}.sessions WHERE id::text = u.id AND opened < pg_postmaster_start_time())) OR EXISTS (
		SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock'
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.objsubid = 1 AND ((l.classid = ((k >> 32) & 4294967295)::oid AND l.objid = (k & 4294967295)::oid)
			OR (l.classid = ((p >> 32) & 4294967295)::oid AND l.objid = (p & 4294967295)::oid)))
		FROM unnest($1::bigint[], $2::text[], $4::bigint[]) u(k, id, p)`), keys, sessions, grace, pipes)
	if err != nil {
		return nil, s.db.connectError(err)
	}
	live := make(map[int64]bool, len(keys))
	for rows.Next() {
		var k int64
		var ok bool
		if err := rows.Scan(&k, &ok); err != nil {
			return nil, err
		}
		live[k] = ok
	}
	if err := rows.Err(); err != nil {
		return nil, s.db.connectError(err)
	}
	out := make(map[string]bool, len(sessions))
	for i, id := range sessions {
		out[id] = live[keys[i]]
	}
	return out, nil
}

// Grace is what RestartGrace found: the server restarted less than the
// grace ago (10 s), and Sessions, of those asked, opened before the
// restart and have not taken their locks again, so that Live answers
// them alive without knowing: each may be reconnecting, or may have died
// with the server.
type Grace struct {
	Ago      time.Duration // since the server started, by its clock
	Left     time.Duration // until the grace ends: then Live answers by the locks alone
	Sessions []string
}

// RestartGrace reports which of sessions Live (and a Batch's Alive)
// answers alive only because the server restarted less than the grace
// ago, as a status command must say that it cannot tell yet: nil when the
// server started longer ago, or when every one of sessions holds its lock
// or opened after the restart. Like Live it reads pg_locks and the
// sessions table, takes no lock and writes nothing. Safe for concurrent
// use.
func (db *DB) RestartGrace(ctx context.Context, sessions []string) (*Grace, error) {
	keys := make([]int64, len(sessions))
	pipes := make([]int64, len(sessions))
	for i, id := range sessions {
		keys[i], pipes[i] = lockKey(id), pipeKey(id)
	}
	var ago float64
	var unsure []string
	err := db.pool.QueryRow(ctx, db.sql(`SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8,
		coalesce(array_agg(u.id) FILTER (WHERE EXISTS (SELECT 1 FROM {s}.sessions WHERE id::text = u.id AND opened < pg_postmaster_start_time())
		AND NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.mode = 'ExclusiveLock'
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.objsubid = 1 AND ((l.classid = ((k >> 32) & 4294967295)::oid AND l.objid = (k & 4294967295)::oid)
			OR (l.classid = ((p >> 32) & 4294967295)::oid AND l.objid = (p & 4294967295)::oid)))), '{}')
		FROM unnest($1::bigint[], $2::text[], $3::bigint[]) u(k, id, p)`), keys, sessions, pipes).Scan(&ago, &unsure)
	if err != nil {
		return nil, db.connectError(err)
	}
	up := time.Duration(ago * float64(time.Second))
	if up >= grace || len(unsure) == 0 {
		return nil, nil
	}
	return &Grace{Ago: up, Left: grace - up, Sessions: unsure}, nil
}

// Blobs returns the run's output store: the database's blobs tables.
func (s *store) Blobs() runstate.Blobs { return s.blobs }

// Close ends the session: clean, its lock released and its row removed;
// otherwise as a killed process would. Close is idempotent.
func (s *store) Close(clean bool) error {
	s.mu.Lock()
	if s.refused > 0 { // the cleanup of an Open refused: not this store's Run
		s.refused--
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	s.closeAhead(clean)
	s.pub.close(clean) // the working directory's last view, the idle writes (publish.go)
	s.mu.Lock()
	ses := s.ses
	s.ses = nil
	s.mu.Unlock()
	if ses != nil && clean {
		s.writeKept(true) // the projections kept for the next batch: there is none now
	}
	if ses != nil {
		ses.close(clean)
	}
	return nil
}

// connect opens a connection of its own (not from the pool, whose
// connections may share the fate of one that just failed), with
// search_path set to the schema alone: resolveCommit's queries name the
// tables without it. It is set by a statement, not as a startup
// parameter, which a pooler in session mode refuses (pgbouncer:
// "unsupported startup parameter: search_path").
func (s *store) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg := s.db.lockCfg.Copy()
	cfg.RuntimeParams["application_name"] = "runstate commit check"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, s.db.connectError(err)
	}
	if _, err := conn.Exec(ctx, "SET search_path TO "+s.db.ident, pgx.QueryExecModeSimpleProtocol); err != nil {
		closeNow(conn)
		return nil, s.db.connectError(err)
	}
	return conn, nil
}

// String names the run in the database, for errors.
func (s *store) String() string {
	return fmt.Sprintf("run %q in schema %s of %s", s.name, s.db.schema, s.db.where)
}

// opened reports whether a session opened the store.
func (s *store) opened() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ses != nil
}

// session returns the open session, or an error for a reader.
func (s *store) session() (*session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ses == nil {
		return nil, fmt.Errorf("pgstore: run %s: this store has no session (open it with OpenStore)", s.name)
	}
	return s.ses, nil
}

// checkRunName refuses run names a person could not read back or type,
// by the rule of stage names (runstate.CheckName): a NUL the database
// refuses, a newline that would split a line of a listing or an error,
// a name too long for the runs table's unique index.
func checkRunName(name string) error { return runstate.CheckName("pgstore: run name", name) }
