package pgstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/runstate/runstate"
)

// Liveness timing: the lock connection is pinged every
// pingEvery with a deadline of pingTimeout. When a ping fails the pinger
// reconnects and takes the lock again, under the run's head row lock and
// refused when a record names the session gone (so a re-hold is safe at
// any time); after lostAfter without a held lock the session is lost for
// good. lostAfter spans the restart grace: a server restart drops every
// session's lock, and the sessions take theirs back when it is up again.
//
// pingTimeout is generous: a ping that runs out ends the connection, and
// so frees the lock, which a loaded machine must not do to a live session.
var (
	pingEvery   = time.Second
	pingTimeout = 5 * time.Second
	lostAfter   = grace
)

// The run alone (ahead.go): a session that is the only one open on its
// run holds the run's lock (runKey) exclusive and may send begins ahead
// of their confirmation. Every session holds the run's lock shared from
// Open to Close, so the exclusive one can be had only by a session alone;
// a session that opens meanwhile takes the run's want lock (wantKey)
// shared, notifies the run's channel and waits for the run's lock; the
// one alone, which waits for that notification on its lock connection
// (and probes the want lock at its pings, in case one was missed), lets
// its exclusive hold go once what it sent ahead is read back. A session
// tries to have the run alone at its pings (every pingEvery); solo false:
// never (tests, and benchmarks that compare).
var solo = true

// errRehold: a batch found the session's own lock free while the session
// is not lost yet (its lock connection died since the last ping, or the
// server restarted): Lock waits for the pinger to take the lock again and
// tries once more.
var errRehold = errors.New("the session's lock is being taken again")

// session is one session's liveness: a dedicated connection (never from
// the pool) that holds the session-level advisory lock lockKey(id) for the
// session's life. Another session that can take the lock knows this one is
// gone: the server frees it when the connection ends, within about 2 ms of
// a SIGKILL and within tcp_user_timeout of the machine vanishing.
//
// A pinger keeps the connection busy enough for the server to notice a
// dead client and for this process to notice a dead server: after
// lostAfter without a good ping it reconnects and takes the lock again,
// unless a record since names the session gone; when that fails for
// lostAfter the session is lost (every later batch fails with
// ErrSessionLost).
type session struct {
	db    *DB
	id    string
	key   int64
	runID string
	since int64 // records after this seq may name the session gone
	// runKey, wantKey: the run's lock, held shared by every session and
	// exclusive by one alone, and its want lock, held shared by a session
	// that waits for the run's lock (ahead.go).
	runKey, wantKey int64
	// yield, set by the store before the pinger starts: it stops sending
	// ahead in the given epoch of having the run alone and reads back what
	// was sent (ahead.go), before the pinger lets the run go; yielded gets
	// a value when it is done.
	yield   func(epoch uint64)
	yielded chan struct{}
	// dropAhead, set by the store before the pinger starts: closes the
	// pipeline's connection, whose key (pipeKey) keeps the session alive
	// to the others (ahead.go); called on a goroutine of its own once the
	// session is lost.
	dropAhead func()

	mu     sync.Mutex
	conn   *pgx.Conn // nil while reconnecting
	lost   error     // sticky: wraps runstate.ErrSessionLost
	lastOK time.Time
	// alone is the connection that holds the run's lock exclusive (nil:
	// none); epoch counts the times it was taken.
	alone *pgx.Conn
	epoch uint64
	// held is closed and replaced when the lock is re-held or lost, for
	// batches that wait for either (waitHeld).
	held chan struct{}
	// lostCh gets the session's lost error once, when it is lost for good
	// (lose), not at close: the Run stops its running stages
	// (runstate.LeaseWatcher).
	lostCh chan error

	kick chan struct{} // re-hold now (a batch found the lock free)
	stop chan struct{}
	done chan struct{}
	// closing ends with stop (close): the pinger's waits for a
	// notification. notified: a notification came during another
	// statement on the lock connection (its OnNotification).
	closing  context.Context
	cancel   context.CancelFunc
	notified atomic.Bool
	// noted counts the yields that a notification started (not a
	// ping's probe of the want lock): for the tests.
	noted atomic.Int64
}

// hold opens the lock connection and takes the session's lock, and the
// run's shared. yield and dropAhead are the store's (ahead.go): nil, the
// session never has the run alone.
func (db *DB) hold(ctx context.Context, runID, id string, yield func(epoch uint64), dropAhead func()) (*session, error) {
	s := &session{db: db, id: id, key: lockKey(id), runID: runID, runKey: runKey(runID), wantKey: wantKey(runID),
		yield: yield, dropAhead: dropAhead, yielded: make(chan struct{}, 1), held: make(chan struct{}), lostCh: make(chan error, 1),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	ok, undo := false, false
	defer func() {
		if !ok {
			// Nothing is left behind: no lock (the run's, its want lock,
			// the session's), no backend still waiting for one, no
			// sessions row.
			pid := conn.PgConn().PID()
			closeNow(conn)
			waitBackendGone(db, pid)
			if undo {
				dropSessionRow(db, id)
			}
		}
	}()
	// The run's lock first, shared: it may wait for a session that has the
	// run alone, and nothing else is held meanwhile.
	if err := s.shareRun(ctx, conn); err != nil {
		return nil, err
	}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", s.key).Scan(&got); err != nil {
		return nil, db.connectError(err)
	}
	if !got {
		return nil, fmt.Errorf("pgstore: session %s: its lock (advisory lock %d) is held by another connection (a session id used twice?); open the run again", id, s.key)
	}
	if err := checkDirect(ctx, conn, s.key); err != nil {
		return nil, fmt.Errorf("pgstore: session %s on %s: %w", id, db.where, err)
	}
	host, _ := os.Hostname()
	if _, err := conn.Exec(ctx, db.sql(`INSERT INTO {s}.sessions (id, run_id, lock_key, host, pid) VALUES ($1, $2, $3, $4, $5)`),
		id, runID, s.key, host, os.Getpid()); err != nil {
		if cerr := ctx.Err(); cerr != nil { // the run's row locked FOR UPDATE (FOR KEY SHARE waits for it)
			// ctx may have ended the call after the server committed
			// the row (pgx does not wait for the reply): the deferred
			// cleanup deletes it once the backend is gone.
			undo = true
			return nil, fmt.Errorf("pgstore: session %s: recording the session on run %s: %w; nothing was recorded: see pg_stat_activity for who holds the run's row in %s.runs", id, runID, lockTimeout(cerr), db.schema)
		}
		return nil, db.rightsError("record session "+id, err)
	}
	ok = true
	s.conn, s.lastOK = conn, time.Now()
	s.closing, s.cancel = context.WithCancel(context.Background())
	go s.ping()
	return s, nil
}

// checkDirect makes sure the lock connection talks to one server process
// for its whole life: through a transaction-mode pooler (pgbouncer) a
// session lock would stay with a server connection the client no longer
// has. Best effort: the backend pid must stay the same across two
// transactions and hold the lock.
func checkDirect(ctx context.Context, conn *pgx.Conn, key int64) error {
	var pid1, pid2 int
	var n int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid1); err != nil {
		return err
	}
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid(), (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND pid = pg_backend_pid() AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid
		AND objsubid = 1 AND granted)`, key).Scan(&pid2, &n); err != nil {
		return err
	}
	if pid1 != pid2 || n != 1 {
		return errors.New("the session's lock connection does not keep one server connection (a transaction-mode pooler?): connect the sessions directly or through a session-mode pooler")
	}
	return nil
}

// connect opens a lock connection: the DB's spare when it has one that
// still answers (keepSpare), else a new one.
func (s *session) connect(ctx context.Context) (*pgx.Conn, error) {
	ch := s.channel()
	note := func(n *pgconn.Notification) {
		if n.Channel == ch {
			s.notified.Store(true)
		}
	}
	listen := "LISTEN " + pgx.Identifier{ch}.Sanitize()
	if sp := s.db.takeSpare(); sp != nil {
		sp.note.Store(&note)
		q := listen
		if sp.named {
			q = "SET application_name TO '" + sessionApp + "'; " + listen
		}
		if _, err := sp.conn.Exec(ctx, q); err == nil {
			return sp.conn, nil
		}
		closeNow(sp.conn) // gone meanwhile (a server restarted): a new one
	}
	cfg := s.db.lockCfg.Copy()
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { note(n) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, s.db.connectError(err)
	}
	if _, err := conn.Exec(ctx, listen); err != nil {
		closeNow(conn)
		return nil, s.db.connectError(err)
	}
	return conn, nil
}

// channel is the run's notification channel: a session that wants the
// run notifies it, and the session alone listens (ahead.go).
func (s *session) channel() string { return fmt.Sprintf("runstate_%016x", uint64(s.runKey)) }

// ping runs until close: a ping every pingEvery; on failure, reconnect.
// The pings also have the run alone, and let it go (ahead.go): every
// pingEvery a session that does not have it tries to take the run's lock
// exclusive (the try is the ping). One that has it waits on its lock
// connection for a notification on the run's channel (a session that
// wants the run notifies it) until its next ping, which probes the want
// lock instead (in case a notification was missed); when another session
// wants the run, it stops sending ahead, reads back what it sent (yield,
// on a goroutine of its own, so that the pings go on) and then lets the
// run's lock go.
func (s *session) ping() {
	defer close(s.done)
	next := time.Now().Add(pingEvery)
	yielding := false
	for {
		s.mu.Lock()
		conn, lost, alone := s.conn, s.lost, s.alone
		s.mu.Unlock()
		if lost != nil {
			return
		}
		due := false // a ping, and the try to have the run alone
		wanted, noted := false, false
		if conn != nil && alone == conn && !yielding && time.Until(next) > 0 {
			// Wait for a notification on the lock connection (or for close,
			// or the next ping).
			ctx, cancel := context.WithDeadline(s.closing, next)
			err := conn.PgConn().WaitForNotification(ctx)
			cancel()
			switch {
			case err == nil || s.notified.Swap(false):
				wanted, noted = true, true
			case s.closing.Err() != nil:
				return
			case ctx.Err() == nil:
				// The connection failed (or fenced closed it).
				s.drop(conn)
				s.rehold()
				continue
			default:
				due = true
			}
		} else {
			t := time.NewTimer(max(time.Until(next), 0))
			select {
			case <-s.stop:
				t.Stop()
				return
			case <-t.C:
				due = true
			case <-s.kick:
			case <-s.yielded:
				t.Stop()
				yielding = false
				s.unlockRun()
				continue
			}
			t.Stop()
		}
		if due {
			next = time.Now().Add(pingEvery)
		}
		s.mu.Lock()
		conn, lost, alone = s.conn, s.lost, s.alone // as the wait left them (a kick: fenced dropped the connection)
		s.mu.Unlock()
		if lost != nil {
			return
		}
		if conn == nil {
			s.rehold()
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		var err error
		switch {
		case alone == conn && !yielding && !wanted && due:
			// The ping probes the want lock: a session that waits for
			// the run holds it.
			free := true
			if err = conn.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", s.wantKey).Scan(&free); err == nil && !free {
				wanted = true
			}
		case due && alone == nil && !yielding && solo && s.yield != nil:
			got := false
			if err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", s.runKey).Scan(&got); err == nil && got {
				// No session waits for the run (the try would fail behind
				// it): an earlier notification is stale.
				s.notified.Store(false)
				s.mu.Lock()
				s.alone = conn
				s.epoch++
				s.mu.Unlock()
			}
		case due:
			_, err = conn.Exec(ctx, ";")
		}
		cancel()
		if err != nil {
			s.drop(conn)
			s.rehold()
			continue
		}
		if due {
			s.mu.Lock()
			s.lastOK = time.Now()
			s.mu.Unlock()
		}
		if wanted && alone == conn && !yielding {
			yielding = true
			if noted {
				s.noted.Add(1)
			}
			s.mu.Lock()
			epoch := s.epoch
			s.mu.Unlock()
			go func() {
				s.yield(epoch)
				s.yielded <- struct{}{}
			}()
		}
	}
}

// unlockRun lets the run's exclusive lock go once a yield read back what
// was sent ahead; the shared one stays.
func (s *session) unlockRun() {
	s.mu.Lock()
	conn := s.alone
	s.alone = nil
	s.mu.Unlock()
	if conn == nil || conn != s.current() {
		return // gone with its connection
	}
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", s.runKey)
	cancel()
	if err != nil {
		s.drop(conn) // the server frees the run's lock with it
	}
}

// current is the lock connection (nil while reconnecting).
func (s *session) current() *pgx.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conn
}

// drop forgets a lock connection that failed: its locks are gone or
// going, the run's exclusive one with them.
func (s *session) drop(conn *pgx.Conn) {
	s.mu.Lock()
	if s.conn == conn {
		s.conn = nil
	}
	if s.alone == conn {
		s.alone = nil
	}
	s.mu.Unlock()
	closeNow(conn)
}

// aloneEpoch reports whether the session has the run alone now, and since
// when (epoch: the count of its takes, which a batch compares before and
// after its commit).
func (s *session) aloneEpoch() (bool, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.alone != nil && s.alone == s.conn && s.lost == nil, s.epoch
}

// shareRun takes the run's lock shared on conn, session-level, for the
// session's life. When a session has the run alone (the lock is held
// exclusive), it takes the run's want lock shared and notifies the run's
// channel, which wakes that session's pinger (or its next ping finds the
// want lock held), waits for the run's lock (as long as ctx allows: the
// one alone lets go once what it sent ahead is back, within a round trip
// or so), and lets the want lock go.
func (s *session) shareRun(ctx context.Context, conn *pgx.Conn) error {
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock_shared($1)", s.runKey).Scan(&ok); err != nil {
		return s.db.connectError(err)
	}
	if ok {
		return nil
	}
	// The want lock, and the notification (a statement of its own: it is
	// sent at its transaction's end), then the wait.
	var pb pgx.Batch
	pb.Queue(noTimeoutsSessionSQL) // the lock connection's own session: the waits below are ctx's
	pb.Queue("SELECT pg_advisory_lock_shared($1)", s.wantKey)
	err := conn.SendBatch(ctx, &pb).Close()
	if err == nil {
		_, err = conn.Exec(ctx, "SELECT pg_notify($1, '')", s.channel())
	}
	if err == nil {
		pb = pgx.Batch{}
		pb.Queue("SELECT pg_advisory_lock_shared($1)", s.runKey)
		pb.Queue("SELECT pg_advisory_unlock_shared($1)", s.wantKey)
		err = conn.SendBatch(ctx, &pb).Close()
	}
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			timeout := ""
			if errors.Is(cerr, context.DeadlineExceeded) {
				timeout = ", or wait longer (the deadline of Open's context: -timeout D for the runstate command)"
			}
			return fmt.Errorf("pgstore: session %s: waiting for the session that has run %s alone to let it go: %w; nothing was recorded: see pg_stat_activity for the connection that holds advisory lock %d exclusive, named 'runstate session' unless its program's DSN names it ('runstate command PID@HOST' for the runstate command's; a frozen process?)%s",
				s.id, s.runID, lockTimeout(cerr), s.runKey, timeout)
		}
		return s.db.connectError(err)
	}
	return nil
}

// rehold tries once to reconnect and take the lock again, under the run's
// head row lock, so that no batch decides about this session meanwhile:
// a record since the session opened that names it gone keeps it lost.
// After lostAfter without success, the session is lost.
func (s *session) rehold() {
	ctx, cancel := context.WithTimeout(context.Background(), pingEvery+pingTimeout)
	defer cancel()
	err := s.tryRehold(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		return
	}
	var gone *goneError
	if errors.As(err, &gone) || time.Since(s.lastOK) >= lostAfter {
		s.lose(err)
	}
}

type goneError struct{ seq int64 }

func (e *goneError) Error() string {
	return fmt.Sprintf("record %d names this session gone", e.seq)
}

func (s *session) tryRehold(ctx context.Context) error {
	conn, err := s.connect(ctx)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			closeNow(conn)
		}
	}()
	// The run's lock shared, before the head row's lock below: a session
	// that has the run alone (it took the run's lock while this one's
	// connection was down) lets it go only once what it sent ahead is
	// back, which may wait for that row.
	if err := s.shareRun(ctx, conn); err != nil {
		return err
	}
	tx, err := conn.BeginTx(ctx, readCommitted)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, noTimeoutsSQL); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, s.db.sql("SELECT 1 FROM {s}.runs WHERE id = $1 FOR NO KEY UPDATE"), s.runID); err != nil {
		return err
	}
	var seq int64
	// A record this session wrote names it as its writer, not as gone:
	// its Open's interrupted records (for sessions that died before it)
	// and the unconfirmed ones of its own effects.
	err = tx.QueryRow(ctx, s.db.sql(`SELECT seq FROM {s}.records WHERE run_id = $1 AND seq > $2
		AND ev IN ('interrupted', 'unconfirmed') AND position($3::bytea IN line) > 0
		AND session IS DISTINCT FROM $4::uuid ORDER BY seq LIMIT 1`),
		s.runID, s.since, []byte(s.id), s.id).Scan(&seq)
	if err == nil {
		return &goneError{seq: seq}
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	var got bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", s.key).Scan(&got); err != nil {
		return err
	}
	if !got {
		return fmt.Errorf("its lock (advisory lock %d) is held by another connection", s.key)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	ok = true
	s.mu.Lock()
	s.conn, s.lastOK = conn, time.Now()
	close(s.held)
	s.held = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// lose makes the session lost for good. The caller holds s.mu.
func (s *session) lose(cause error) {
	if s.lost != nil {
		return
	}
	s.lost = fmt.Errorf("%w: session %s lost its lock on %s: %v; this Run is read-only: open the run again",
		runstate.ErrSessionLost, s.id, s.db.where, cause)
	if s.conn != nil {
		// Free the lock now; the pinger or close ends the connection (a
		// pgx.Conn is not safe for concurrent use, its socket is).
		_ = s.conn.PgConn().Conn().Close()
	}
	close(s.held)
	s.held = make(chan struct{})
	s.lostCh <- s.lost // buffered, sent once: s.lost was nil
	if s.dropAhead != nil {
		go s.dropAhead() // it takes the pipeline's mutex, which a commit holding it may hold while it asks s.mu
	}
}

var _ runstate.LeaseWatcher = (*store)(nil)

// LeaseLost is runstate.LeaseWatcher: the session's lost error, once the
// pinger could not take its lock again within lostAfter or found a record
// naming it gone, or a batch found its lock free past lostAfter. The Run
// then cancels its running stages' contexts. Nil for a store that no
// session opened.
func (s *store) LeaseLost() <-chan error {
	ses, err := s.session()
	if err != nil {
		return nil
	}
	return ses.lostCh
}

// check returns the sticky error of a lost session. A session whose lock
// connection is being re-established is waited for (as long as ctx allows,
// at most lostAfter).
func (s *session) check(ctx context.Context) error {
	for {
		s.mu.Lock()
		conn, lost, held := s.conn, s.lost, s.held
		s.mu.Unlock()
		if lost != nil {
			return lost
		}
		if conn != nil {
			return nil
		}
		select {
		case <-held:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fenced handles a batch that found the session's own lock free. Within
// lostAfter of the last good ping that is a lock connection that died
// since (or a server restart): the connection is dropped, the pinger takes
// the lock again at once, and errRehold tells Lock to wait for it. Later,
// the session is lost.
func (s *session) fenced() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost == nil && time.Since(s.lastOK) < lostAfter {
		if s.conn != nil {
			// Its socket only: the pinger owns the pgx.Conn.
			_ = s.conn.PgConn().Conn().Close()
			s.conn = nil
		}
		select {
		case s.kick <- struct{}{}:
		default:
		}
		return fmt.Errorf("pgstore: session %s: %w on %s; nothing was recorded", s.id, errRehold, s.db.where)
	}
	s.lose(errors.New("a batch found the lock free"))
	return s.lost
}

// close stops the pinger and ends the lock connection: clean, with the
// sessions row removed; otherwise as a killed process would (the socket
// closed without a word).
func (s *session) close(clean bool) {
	close(s.stop)
	s.cancel()
	<-s.done
	s.mu.Lock()
	conn := s.conn
	s.conn = nil
	if s.lost == nil {
		s.lost = fmt.Errorf("%w: session %s is closed", runstate.ErrSessionLost, s.id)
	}
	s.mu.Unlock()
	if conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !clean {
		closeNow(conn)
		// The server frees the lock once it sees the socket closed, a
		// moment later: wait for that, so that the next session finds
		// this one gone as it would a killed process's (tests).
		waitAdvisoryFree(ctx, s.db, s.key)
		return
	}
	// Unlocked before Close returns (a Terminate message alone frees the
	// lock only when the server process ends, a moment later).
	var pb pgx.Batch
	pb.Queue(s.db.sql("DELETE FROM {s}.sessions WHERE id = $1"), s.id)
	pb.Queue("SELECT pg_advisory_unlock_all()") // the session's lock, the run's (shared, and exclusive if alone)
	_ = conn.SendBatch(ctx, &pb).Close()
	_ = conn.Close(ctx)
}

// lockTimeout is a context's error for a wait that it ended: a deadline
// also wraps runstate.ErrLockTimeout, as the file store's lock waits do.
func lockTimeout(cerr error) error {
	if errors.Is(cerr, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", runstate.ErrLockTimeout, cerr)
	}
	return cerr
}

// waitBackendGone waits, at most a second, until the server has ended
// the backend pid of a connection just closed (closeNow, or pgx's own
// close when a context ended a statement: lockOnce): its session
// locks are then free, and a statement it was waiting in is over (pgx
// asks the server to cancel it when a context ends the wait).
func waitBackendGone(db *DB, pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for {
		var alive bool
		err := db.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", int64(pid)).Scan(&alive)
		if err != nil || !alive {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// dropSessionRow deletes session id's row (best effort, at most a
// second): a start that failed leaves none behind, also when the INSERT
// that ctx ended had committed.
func dropSessionRow(db *DB, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = db.pool.Exec(ctx, db.sql("DELETE FROM {s}.sessions WHERE id = $1"), id)
}

// waitAdvisoryFree waits, as long as ctx allows, until the server has
// freed the session-level advisory lock key (held by a connection just
// closed without a word: the server frees it once it sees the socket
// closed, a moment later).
func waitAdvisoryFree(ctx context.Context, db *DB, key int64) {
	for ctx.Err() == nil && advisoryHeld(ctx, db, key) {
		time.Sleep(time.Millisecond)
	}
}

// advisoryHeld reports whether a session-level advisory lock on key is
// held, from pg_locks (true when that cannot be read).
func advisoryHeld(ctx context.Context, db *DB, key int64) bool {
	var n int
	err := db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1
		AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`, key).Scan(&n)
	return err != nil || n > 0
}

// closeNow closes conn's socket without the protocol's goodbye, as a
// killed process would: the server ends the backend and frees its locks.
func closeNow(conn *pgx.Conn) {
	if nc := conn.PgConn().Conn(); nc != nil {
		_ = nc.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = conn.Close(ctx)
}
