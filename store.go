package runstate

import (
	"context"
	"io"
	"time"
)

// A Run is three things: the state (the projection every decision is made
// on, rebuilt from records), the committer (it decides records on the state
// under the run's lock, batches them, makes them durable and publishes the
// projections) and a Store, where the records live. Stages and effects talk
// only to the committer; only a Store touches storage.
//
// Store is that seam, in the manner of hashicorp/raft's LogStore: this
// package defines it and writes down what an implementation must guarantee;
// implementations may live in other modules (pgstore keeps a run in
// PostgreSQL). The file store (Open, NewFileStore) keeps a run directory:
// logs/ledger.jsonl and its journal, lock files, snapshots. Records cross
// the seam as ledger lines, the exact bytes that the file store writes (one
// JSON object each, with its hash chain): a store keeps them as they are,
// and the Run checks every line it reads (seq, chain, crc) itself.
//
// The words "must" below are the contract a second implementation is
// written against; runstatetest/storetest checks them on any store.
//
// Of note: Read returns the size of a torn last line, not its offset
// (the offset is where the last line passed ends; the size is what
// Status.Torn and Verify report); Position carries CRC (the chain check needs it to
// resume from a snapshot); Store has String (errors name where the
// records live); TryLocker is an optional extra (the committer's
// lock-or-hand-off, lead/leadLater, needs a lock attempt that does not
// wait); Addresser is another (the handoff of a run that is not a
// directory names the store's places, not logs/ledger.jsonl).

// Position names the last record a Run (or a reader) has seen: the chain's
// head. The zero Position is before the first record.
type Position struct {
	// Seq is the last record's seq (records are numbered 1, 2, … without
	// a gap); 0 before the first.
	Seq int64
	// Hash is the chain hash of the last record's line (hex SHA-256 of
	// the line without its '\n'); "" before the first.
	Hash string
	// End is the length of all lines up to and including the last, each
	// with its '\n': in the file store the ledger's byte offset past the
	// record. Every store counts it the same way, so a Position is the
	// same whichever store holds the records.
	End int64
	// LastLen is the length of the last record's line with its '\n'.
	LastLen int64
	// CRC reports that the last record's line has a crc field: the line
	// after it must have one too. Every line this package writes has one;
	// only ledgers written before format 1's crc field lack it.
	CRC bool
}

// Store keeps the records of one run, and the liveness of the sessions
// working on it. A Run calls its methods from one goroutine at a time,
// except Read and Live, which may run concurrently with everything (also
// from other processes, on a Store that no session has opened), and Blobs
// and String, which any goroutine of the Run may call at any time (Begin
// and Complete ask Blobs outside the run's lock; errors and log messages
// name the store). A Store value serves one Run: OpenStore calls Open once
// and Close once.
type Store interface {
	// Open attaches the session (a UUIDv7 the Run made) to the run. It
	// creates the run's storage when it is missing (an empty run: the
	// Run appends the create record; among racing creators exactly one
	// create record must land, which Lock's exclusion and Tail ensure),
	// recovers what a crash left before anything reads (a torn tail is
	// cut and kept aside, records that only a journal holds are copied
	// back), and takes the session's liveness: a lease that ends with
	// the process (a lock the kernel drops, a database connection's
	// advisory lock), so that Batch.Alive and Live can prove the session
	// gone once it died. It returns the newest snapshot still consistent
	// with the records (manifest.json's bytes as Batch.Publish was given
	// them; nil: replay everything) and the Position it reflects. The
	// returned Position must name a record the store holds, with the
	// same hash.
	Open(ctx context.Context, session string) (snapshot []byte, at Position, err error)

	// Lock takes the run's writer lock for one batch: exclusive among
	// all sessions of the run, in every process on every machine that
	// can reach the store, until the Batch's Unlock or Abort. from is the
	// caller's Position; the Batch's Tail yields what others appended
	// after it. Lock waits as long as ctx allows; when ctx ends first it
	// returns an error wrapping ctx's error (ErrLockTimeout for a
	// deadline) that names the holder where it can, and holds nothing.
	// When the session's liveness is gone (a lease lost) it returns an
	// error wrapping ErrSessionLost: the Run turns read-only, since
	// another session may already have taken this one's stages over.
	Lock(ctx context.Context, from Position) (Batch, error)

	// Read calls fn for each line after from, in order, without the
	// '\n', up to the last complete line; it takes no lock and writes
	// nothing. The lines are a consistent prefix of the run's records:
	// never a line that a later reader will not see at the same place,
	// never a gap. A torn last line (a writer died mid-append, or is
	// still writing) is not passed to fn: Read returns its size in bytes
	// in torn (0: none); it starts where the last line passed ends. A
	// store that cannot tear a line returns 0. fn's slice is valid
	// only during the call; an error from fn stops the read and is
	// returned as it is. Read must work on a Store that no session has
	// opened (Inspect, ReadLedger, Verify use it), and be safe for
	// concurrent use.
	Read(ctx context.Context, from Position, fn func(line []byte) error) (torn int64, err error)

	// Live reports which of sessions may still be running, by the rule
	// of Batch.Alive; it writes nothing and needs no lock (a status
	// command's probe). Safe for concurrent use.
	Live(ctx context.Context, sessions []string) (map[string]bool, error)

	// Blobs returns where the store keeps outputs' bytes, content
	// addressed, so that a run's outputs can follow it to another
	// machine; nil means outputs live in the Run's local directory only
	// (the file store).
	Blobs() Blobs

	// Close ends the session. With clean (a close record was made
	// durable) it releases the lease so that the session reads as closed,
	// and every handle; without, it releases what a killed process's exit
	// would release and nothing more (tests: runstatetest's Crash), so
	// that the next session finds this one gone. Lines appended but not
	// made durable may be lost then, as in a crash. Close is called once,
	// with no Batch open, except by runstatetest's CrashAt at a point
	// inside a batch (after-complete, between-projections): it calls
	// Close(false) while that Batch is open, and the Batch's Unlock or
	// Abort may come after it. A store used with CrashAt must bear that.
	Close(clean bool) error

	// String names where the records live, for errors and messages: a
	// file path, a database and table with the run's id.
	String() string
}

// Batch is the run's writer lock, held for one append batch (Store.Lock).
// Its methods are called by one goroutine, in the order Tail, then any of
// Now/Alive/Append, then Sync (when the batch acknowledges something),
// Publish, and finally Unlock or Abort; a SideWriter's Now, Alive and
// AppendWhileSyncing are the exception (another goroutine calls them
// while Sync runs). Every method but Unlock and Abort may be skipped.
type Batch interface {
	// Tail calls fn for each line that other sessions appended after the
	// Position given to Lock, in order, without the '\n' (the Run checks
	// and applies them). A torn tail after them is cut (and kept aside
	// where the store can) before Tail returns. fn's slice is valid only
	// during the call.
	Tail(fn func(line []byte) error) error

	// Now is the time to stamp this batch's records with: the store's
	// clock where sessions on several machines share it (a database's
	// now()), else the local clock, in UTC.
	Now() time.Time

	// Alive reports whether session may still be running, and so may
	// hold a stage or an effect: a running stage of a session that is not
	// alive is begun again, an intent is checked. "Not alive" needs proof,
	// because being wrong runs a stage twice and sends an effect twice:
	// the session's lease was released by its death (a lock the kernel
	// dropped, a connection the server ended) or by a clean Close. When
	// the store cannot tell, the answer is true (the safe side). The
	// answer holds while the lock is held: a session proven gone cannot
	// come back. Alive("") is false.
	Alive(session string) bool

	// Append adds whole lines (each with its '\n') after the run's last
	// record. recs are the same records, decoded (a database may keep
	// them in columns besides the line); to is the Position after the
	// last of them. Lines become visible to Read and to other sessions'
	// Tail all at once or not at all: immediately for a SideWriter (the
	// file store), at Unlock or Sync otherwise. On an error none of
	// lines may remain: a store that cannot undo a partial append returns
	// a *WriteError with Sticky set, and the Run turns read-only. Append
	// may be called more than once in a batch.
	Append(recs []*Record, lines []byte, to Position) error

	// Sync makes every line appended in this batch, and every line
	// appended before it, durable: after it returns they survive a crash
	// of the process, of the machine and (for a database) of the server.
	// A failure is never retried (after a failed fsync the kernel may
	// have dropped the pages and cleared the error): the Run turns
	// read-only and its callers are told the records may be lost.
	// ErrSessionLost means the session's lease ended before the records
	// became durable. ctx bounds a store that waits on a network. With
	// Options.NoSync the Run still calls Sync (a store checks what it
	// must); the file store then makes no fsync.
	Sync(ctx context.Context) error

	// Publish replaces the projections that readers without the store
	// read: manifest (manifest.json, the snapshot Open returns) and
	// handoff (logs/next-steps.txt); a nil one is left as it is. at is
	// the Position they reflect. Best effort: a failure is the store's
	// to log, never the Run's; the newest at wins; nothing needs them
	// for correctness.
	Publish(at Position, manifest, handoff []byte)

	// Unlock releases the lock. Lines appended and not made durable stay
	// appended (a begin record needs no fsync: the stage's end makes it
	// durable); the next Sync of any session, or a clean Close, makes
	// them durable. An error means the lock state is unknown: the Run
	// turns read-only.
	Unlock() error

	// Abort drops what Append wrote in this batch and has not been made
	// durable, and releases the lock.
	Abort() error
}

// TryLocker is a Store that can take the writer lock without waiting. The
// committer tries it first: when another session holds the lock, it hands
// the batch to a goroutine that waits (Lock), so that no caller waits
// longer than its own context allows. Without it every batch goes through
// that goroutine (a hand-off per batch, which a store behind a network
// does not notice).
type TryLocker interface {
	// TryLock is Lock without a wait: ok is false, with a nil Batch and
	// error, when another session holds the lock.
	TryLock(from Position) (b Batch, ok bool, err error)
}

// Optimist is a Store that can run a batch without taking the run's
// writer lock first, on the bet that no other session appended since the
// Position the session last saw: the lock, the check that the head is
// still there, the records and the commit then travel together (one round
// trip to a database instead of two). The committer tries it first.
type Optimist interface {
	// LockOptimistic returns an OptimisticBatch for from, holding no lock,
	// or ok false when the store would rather lock (it saw other
	// sessions append lately, a conflict, or its session is not
	// confirmed): the committer then locks as usual. It does not wait.
	LockOptimistic(from Position) (b OptimisticBatch, ok bool)
}

// OptimisticBatch is a Batch from LockOptimistic, and only that: the
// committer takes any Batch with a Confirm method for an optimistic one
// and Confirms it before releasing its callers, so Lock and TryLock must
// return batches without one (a locked batch of begins releases its
// callers first and commits at Unlock, while they go on). Its Tail
// yields nothing (it bets that there is nothing); Now is the store's
// clock as last seen,
// never before the head's records; Alive answers true (the safe side) for
// any session but the batch's own, and the batch then cannot be right
// without the lock: its Sync and Confirm return ErrConflict. Its Sync and
// Confirm write what Append queued if and only if the run's head is still
// the Position given to LockOptimistic and the session's liveness holds,
// at once and atomically, without waiting for another session's batch
// (one under way is a conflict); otherwise they write nothing and return an
// error wrapping ErrConflict (or ErrSessionLost when the session is
// proven gone). A batch that appended nothing cannot prove its
// decisions were made on the head, so its Confirm returns ErrConflict
// too. On ErrConflict the committer rolls its state back to the
// Position, Aborts the batch, and decides every transaction of it again
// in its next batch, which it does not ask LockOptimistic for (TryLock or
// Lock, as without an Optimist). Unlock and Abort after Sync or Confirm release
// nothing but the batch. The committer does not Confirm a batch of the
// handoff timer's flushes alone (they decide nothing): its Unlock writes
// what Publish kept, if anything, without the lock (newest at wins).
type OptimisticBatch interface {
	Batch
	// Confirm is Sync without the wait for durability, for a batch no
	// transaction of which asks for an fsync (begins): when it returns
	// nil, the lines are the run's as after Unlock. The committer calls
	// it before it releases the batch's callers. A store that can prove
	// no other session may append meanwhile (pgstore, for a session
	// alone on its run) may return once the lines are on their way, in
	// order, so that nothing can come before them (sent to the database,
	// which runs them if the process dies now) without waiting for the
	// answer; if they then do not land, its next Lock, Sync or Confirm
	// fails with an error wrapping ErrSessionLost (the Run turns
	// read-only: it went on as if they had).
	Confirm(ctx context.Context) error
}

// SideWriter is a Batch whose Append makes lines visible at once, and which
// accepts more lines while a Sync is under way: the committer then writes
// begin records (which need no fsync) during another batch's fsync instead
// of making them wait for it, and lets calls whose records need no fsync
// return before the batch's Sync. Besides AppendWhileSyncing, the side
// writer calls the Batch's Now and Alive while Sync runs on the leader's
// goroutine. Only the file store is one.
type SideWriter interface {
	// AppendWhileSyncing is Append, called by another goroutine while
	// Sync runs; the lines follow every line appended before.
	AppendWhileSyncing(recs []*Record, lines []byte, to Position) error
}

// Pacer is a Store that writes the projections (Batch.Publish) on a pace
// of its own rather than at every Publish, keeping only the newest of
// each given meanwhile: pgstore writes the handoff into the database at
// most once a second and into a working directory's views at most every
// 50 ms. Rendering a projection costs the Run CPU under the run's lock
// (the handoff is O(running stages), the manifest O(stages)), so the Run
// asks first and renders only those the store would write now. A
// handoff it skips is not lost: the Run's handoff timer (the one that
// republishes a handoff lagging by begins, handoffLag) runs a batch of
// its own that appends nothing, asks again, and renders the newest
// handoff once the store says it is due; a skipped manifest is rendered
// by a later batch. The close record's batch renders both whatever the
// store says, so a clean Close publishes the final state.
//
// The file store is no Pacer: its logs/next-steps.txt is replaced after
// every batch that appends a record other than a begin, before the call
// returns (so it is current even if the process dies the next instant),
// and its manifest.json every Options.ManifestInterval. Nothing is
// durable through this interface: projections stay best effort, and a
// reader renders the exact handoff from the records anyway.
type Pacer interface {
	// PublishDue reports whether the store would write a manifest and a
	// handoff that Publish gave it now; the Run renders only those (a
	// manifest also only once Options.ManifestInterval has passed). A
	// store that writes what it keeps on a timer of its own must write
	// the newest it was given within its pace, also when no batch comes.
	// The Run calls it after a batch's records are durable and before its
	// Publish, with the run's lock held (or in an optimistic batch), from
	// one goroutine at a time; it must not block.
	PublishDue() (manifest, handoff bool)
}

// Blobs keeps outputs' bytes by their hex SHA-256, for a store that spans
// machines (Store.Blobs). Its methods are safe for concurrent use.
type Blobs interface {
	// Missing returns those of sha256s that the store does not hold.
	Missing(ctx context.Context, sha256s []string) ([]string, error)
	// Put stores size bytes read from r under sha256, durably when it
	// returns; the store checks the hash. Idempotent. Bytes the store
	// holds under sha256 already are replaced by these, which hash to it:
	// the Run puts again, without asking Missing, bytes that it found
	// damaged in the store (a Get whose bytes did not hash to sha256) when
	// a stage that ran again because of it completes with them.
	Put(ctx context.Context, sha256 string, size int64, r io.Reader) error
	// Get returns the bytes stored under sha256 (an error wrapping
	// fs.ErrNotExist when there are none).
	Get(ctx context.Context, sha256 string) (io.ReadCloser, error)
}

// Addresser is a Store that names its own places, for the handoff
// (logs/next-steps.txt, Run.NextSteps, NextStepsStore): a fresh session
// reads there where to look at the run. Status's blocker Actions and the
// advice in errors (ErrNeedsPerson, ErrFatal, ErrUnconfirmed) name the run
// by Address too. A run directory's handoff names its
// files (logs/ledger.jsonl, manifest.json) and the runstate commands on
// the directory; a store without those files (a database, memory) says
// instead where its records are. The Run asks once, at OpenStore, and
// again to name the run in a *CorruptError. Safe for concurrent use.
type Addresser interface {
	// Address is the run's address as the runstate command takes it
	// (pgstore: postgres://USER@HOST:PORT/DB?run=NAME), without a
	// password: the handoff's commands name the run by it and its last
	// line is "runstate status ADDRESS; runstate log ADDRESS". "" when no
	// command can read the store (a store in memory): the advice then
	// names the Run's methods to call (Run.Approve ...) instead of
	// commands, and that line is left out.
	Address() string
	// LookAt is the handoff's "look at:" paragraph before that line:
	// where the records are and how to read them, one line each, without
	// '\n' (the Run escapes them).
	LookAt() []string
}

// Verifier is a Store with checks of its own (a database's constraints,
// its blob table): VerifyStore adds their problems to its report.
type Verifier interface {
	// VerifyStore returns the problems the store's own checks find. The
	// package's VerifyStore calls it, on a Store that no session opened
	// as well, while sessions append: like Read, it must take no lock,
	// write nothing and be safe for concurrent use. An error means the
	// checks could not run; VerifyStore returns it.
	VerifyStore(ctx context.Context) ([]Problem, error)
}

// LeaseWatcher is a Store whose session's lease can end while the process
// that holds it lives: a database connection's advisory lock, lost with
// the connection (pgstore). Once the lease is lost another session may
// prove this one gone and take its stages over, so the Run must stop
// them at once rather than at its next append: it turns read-only and
// cancels the contexts of its running stages (the ctx Do passes to the
// stage function, Stage.Context) with the store's error as the cause.
//
// The file store is no LeaseWatcher: its lease is a lock file that the
// kernel holds for the process (flock on an open descriptor), which no
// other process can take while the holder lives; only a person can end
// it, by removing logs/sessions/<session>.lock and creating it again (the
// documented proof that a session is gone). runstatetest's memory store
// is none either: its sessions die only by MemStore.Crash, which the next
// append reports with ErrSessionLost. For any store, an append that
// fails with ErrSessionLost stops the running stages the same way.
type LeaseWatcher interface {
	// LeaseLost returns the channel on which the store sends, once, an
	// error wrapping ErrSessionLost when the session's lease is lost for
	// good (it could not be held again, or a record names the session
	// gone): from then on every Lock must fail with ErrSessionLost. It
	// must be buffered (the store never blocks on it) and get nothing
	// while the lease holds, nor at Close. The Run calls it once, after
	// Open returned; nil means the lease cannot be lost.
	LeaseLost() <-chan error
}
