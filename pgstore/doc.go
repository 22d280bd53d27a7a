// Package pgstore keeps runstate runs in PostgreSQL, so that agent fleets
// on several machines share one run with the guarantees of a run
// directory: gapless seq, the hash chain, one complete per stage attempt,
// ErrBusy for a stage a live session holds, interrupted when a session (or
// its machine) dies, no repeat of a confirmed effect.
//
//	db, err := pgstore.Connect(ctx, "postgres://agent@db:5432/agents?schema=runstate")
//	defer db.Close()
//	run, err := db.Open(ctx, "billing-2026-11-29", workDir, &runstate.Options{Request: "..."})
//	// run is a *runstate.Run: Plan, Do, Begin, Effect, Approve ... as on a directory.
//	st, err := db.Inspect(ctx, "billing-2026-11-29") // read-only, no session, no lock
//
// examples/fleet is a runnable program of three machines (processes, each
// with its working directory) sharing one run, one of them killed in the
// middle of a stage: cd pgstore && ./testdb.sh go run ./examples/fleet.
//
// # Records
//
// A record is stored as its exact ledger line (bytea) with its sha256, in
// records(run_id, seq); Export writes the lines back as a valid
// logs/ledger.jsonl, byte for byte, and the core's decoder, chain check and
// Verify read them unchanged. The run's head row (runs: last seq, hash,
// end) is locked FOR NO KEY UPDATE by every append batch, which serializes
// the run's writers on every machine; each batch is one transaction (at
// READ COMMITTED, whatever default_transaction_isolation the server,
// database, role or DSN sets: a stricter level made a second session's
// Lock fail with a serialization error; and without the server's
// lock_timeout, statement_timeout and idle_in_transaction_session_timeout
// where it waits for a lock or decides under one: the call's context
// bounds the wait): one
// pipelined round trip to lock the head, probe the session's own lock and
// read what others appended, one to insert the records, move the head
// (compare-and-set) and COMMIT. When the session's position is still the
// head as it last saw it (no other session appended lately), a batch is
// one round trip instead (runstate.Optimist): BEGIN, a statement that
// locks the head row NOWAIT only if it is still at that position and
// probes the session's own lock under it, then the same statements and
// COMMIT; a head that moved or is held makes it fail with nothing
// written, and the Run decides the batch again after a Lock. A batch that
// acknowledges something (a complete, fail, effect) waits for the WAL
// flush with synchronous_commit on (also where the connection's is off,
// from the server's, database's or role's defaults or the DSN: pgstore
// sets it for those transactions): when the call returns, its records are
// in the server's WAL on disk, provided the server runs with fsync on (a server
// with fsync off makes no commit durable: pgstore does not refuse it, as
// test setups use it, but the run's handoff starts its "look at" lines
// with a warning). A
// batch of begins alone commits with
// synchronous_commit off: visible at once, and durable with the next
// synchronous commit (WAL is flushed in order), as a run directory's
// unsynced begin is. A locked batch that acknowledges (the sessions share
// the run) does not hold the run's head row through its flush: its
// records commit with synchronous_commit off, which releases the row to
// the next session's batch, and a transaction after them in the same
// round trip updates the session's own row and commits with
// synchronous_commit on, so the call returns once the WAL is on disk up
// to that commit, past the records'. The records are visible to the other
// sessions and to readers from their own COMMIT, one flush before they
// are durable, as begins are: a server crash in between loses them with
// everything after them, none of it acknowledged. 4 processes on one run
// made about a fifth more checkpoints a second so (pgstore/README.md).
//
// # Sessions
//
// Each session holds a session-level advisory lock (key: the first 8
// bytes of sha256("runstate/session/"+id)) on a connection of its own,
// opened with tcp_keepalives and tcp_user_timeout=10000, and pinged every
// second. Another session that can take the lock knows the session is
// gone: within milliseconds of a SIGKILL (the server sees the socket
// close), within about 10 s of its machine vanishing (tcp_user_timeout).
// Every append batch checks, under the head row lock, that its own session
// still holds its lock, so a session cut off can no longer append
// (runstate.ErrSessionLost once it is lost for good). The one exception is
// a batch of begins sent ahead by a session alone on its run (below):
// written before the session was cut off, it lands if the server runs it
// before any other session's record, and ends no stage. A session whose lock
// connection died takes its lock back (under the head row lock) unless a
// record names it gone meanwhile; after 10 s without it, it is lost. A
// lost session's Run stops its running stages at once (the store is a
// runstate.LeaseWatcher): their contexts are cancelled, with a cause
// wrapping runstate.ErrSessionLost, as soon as the pinger finds a record
// that names the session gone: within pingEvery (1 s) and a round trip of
// the server being reachable again (measured 0.51-0.77 s, median 0.64 s,
// 10 runs), or about 10 s after its last good ping when the server stays
// out of reach (measured 9.9 s after the cut). A
// server that started less than 10 s ago lost every lock with its restart:
// within that grace a session opened before the restart counts as alive
// (DB.RestartGrace names those that have not taken their locks again, for
// a status that must say it cannot tell yet). Nor does a restart fail the
// calls under way: batches, blob reads and puts, and the DB's readers
// (Inspect, NextSteps, Verify, Runs, Has; ReadLedger and Export until
// they have handed over a record) are tried again, with a growing pause,
// for as long as a session may take its lock back (10 s).
//
// # A session alone on its run
//
// Every session also holds its run's advisory lock (key: from
// sha256("runstate/run/"+id)) shared, from Open to Close. A session that
// is the only one open takes it exclusive (its pinger tries every second)
// and then sends its batches pipelined on one connection of its own: a batch
// of begins is written and the stage's work starts without its reply; the
// complete's batch is written behind it and reads both replies. A
// checkpoint then waits for one round trip instead of two, and the server
// runs the begin while the client writes the output (here 30-35 µs for
// the begin instead of 174-228, pgcompare). Nothing else changes: no other
// session can append before the begin lands (it would need the run's
// lock), and a SIGKILL during the work leaves the begin to the server (the
// next session finds the stage interrupted, attempt counted), also when
// the server runs it only after it has freed the killed session's lock:
// the pipeline's connection (one of its own, with the lock connection's
// keepalives) holds the session's pipeline key, and the others find a
// session gone only when its lock and that key are both free, the key
// being freed when the server ends the backend, after the input it had.
// The begin's statement checks the head (the compare-and-set) but, unlike
// every other batch's, not the session's own lock, which the server may
// have freed by then: a session that found this one gone and recorded
// anything has moved the head, and the begin fails. A begin sent so that
// does not land (the head moved, a server crash before its WAL writer
// flushed it) fails the next batch with runstate.ErrSessionLost: the Run
// turns read-only, as after any lost record. A session that opens meanwhile takes the run's want lock,
// notifies the run's channel (LISTEN/NOTIFY) and waits for the run's
// lock; the one alone, which waits for that notification on its lock
// connection (and probes the want lock at its pings, once a second, in
// case one was missed), reads back what it sent ahead and lets go: a few
// round trips (the newcomer's Open took 50-60 ms in all, measured,
// against 49-53 ms for an Open with no other session), and neither has the run
// alone again while both are open. Its wait is bounded by Open's context only: a
// session alone that is frozen (SIGSTOP, a debugger) keeps newcomers
// waiting until it runs again or its connection ends (tcp_user_timeout,
// about 10 s, for a vanished machine). Every process on a schema must run
// this pgstore or a later one (schema version 3: an older one refuses the
// schema; one that was already connected when the schema was upgraded
// takes no run lock: restart it).
//
// # Poolers
//
// Each connection must be a server session of its own: the session lock
// and pgx's prepared statements live in it. Connect refuses a pooler that
// shares server sessions among clients (pgbouncer pool_mode=transaction
// or statement) with what to do; one in session mode works. A session's
// lock connection sets tcp_keepalives_* and tcp_user_timeout, which
// pgbouncer refuses unless told to ignore them (Open says which); through
// it, a session's liveness is the pooler's: it must notice a vanished
// client (its own client keepalives and tcp_user_timeout) and release the
// lock when the client goes (server_reset_query DISCARD ALL, the default).
//
// # Outputs
//
// Outputs stay files in each machine's work dir; their bytes are also
// kept in the database, content addressed: a small output's (up to 64
// KiB) in its outputs row, committed with the record that names it (a
// check refuses bytes that do not hash to the row's sha256); a larger
// one's in blobs and blob_chunks (1 MiB each), stored before that record
// (a foreign key makes an output without its bytes impossible). Begin on
// another machine fetches its After stages' outputs, and restores a done
// stage's missing or altered local copy. MaxBlob caps one output (256
// MiB). Verify rehashes the bytes in outputs rows and checks every blob's
// rows and chunks; with RehashBlobs it also reads the blobs' bytes back
// and rehashes them.
//
// # A machine's work dir
//
// Besides the outputs, each work dir holds its session's view of the run,
// as a run directory holds its projections: logs/next-steps.txt and
// manifest.json (each naming the seq it reflects; written off the append
// path and at Close: the handoff within about 100 ms of a record (the Run
// renders it at the store's pace, runstate.Pacer), the manifest when the
// Run renders one, at most every Options.ManifestInterval; never read
// back: the database is the truth), and logs/run.json, the run's address without a
// password, so that 'runstate status DIR' there reads the run; the same for
// a Run opened with DB.Open or with runstate.OpenStore(db.Store(name), dir,
// opts) (the store is a runstate.WorkDirViewer; a work dir whose
// logs/run.json names another run, by name or by id, is refused before
// the session records anything: runstate.WorkDirChecker). The handoff's "look at:"
// lines, Status's blocker Actions and the advice in errors name the run by
// its address (runstate.Addresser).
//
// # Schema
//
// Connect creates the schema (default "runstate", schema=NAME in the DSN)
// and applies the embedded migrations under an advisory lock;
// ConnectReadOnly never writes. Each run is a row of runs (name UNIQUE);
// records, outputs, blobs, blob_chunks, sessions and projections (the
// newest manifest snapshot, from which Open resumes, and handoff text)
// hold the rest. Every DB method is safe for concurrent use.
package pgstore
