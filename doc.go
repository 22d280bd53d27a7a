// Package runstate gives agent programs durable, restartable run state: a
// run directory whose files say, in seconds, what is complete, what
// evidence is still valid and what is safe to do next, so that a session
// that ends (a killed process, a restarted server, a full context window)
// can be followed by a fresh one that neither redoes finished work nor
// repeats a side effect.
//
// # Using it
//
// A program opens its run directory, says what work exists, and runs each
// stage through Do:
//
//	run, err := runstate.Open("runs/billing", &runstate.Options{Request: "add tests for the billing parser"})
//	if err != nil {
//		return err // a damaged run is refused, naming the file, line and offset
//	}
//	defer run.Close()
//	if err := run.Plan(ctx, "inspect", "plan", "execute", "verify"); err != nil {
//		return err
//	}
//	err = run.Do(ctx, "plan", func(ctx context.Context, st *runstate.Stage) error {
//		return st.WriteFile("artifacts/plan.md", plan)
//	}, runstate.File("src/parser.go"), runstate.After("inspect"))
//
// Open creates the run, or resumes the one in the directory (a Request
// other than the run's is ErrMismatch). Do returns nil at once, without
// calling fn, when the stage is complete and its evidence still holds.
// Otherwise it records a begin, calls fn, and records a complete with the
// outputs fn wrote (Stage.WriteFile, or Stage.Output for a file written by
// other means); when fn returns an error, a failure of the class the error
// carries: Retryable (the default, up to Options.MaxAttempts, then a person
// is asked; ctx's cancellation is not counted), NeedsPerson or Fatal. Begin, Stage.Complete and Stage.Fail are
// the primitives under Do; Run.Skip says a stage is not needed.
//
// A side effect goes through Run.Effect, which records an intent before it
// calls Effect.Do and the receipt after, so that a confirmed effect is never
// sent again; after a crash between the two, Effect.Check asks the
// receiving system. A review gate calls Stage.Await; a person clears it with
// Run.Approve (or 'runstate approve'), forces a redo with Run.Invalidate,
// and settles an effect of unknown outcome with Run.Resolve.
//
// The next session runs the same program: Do skips every stage that is done
// and still valid, and the stage that was running when the last session died
// is recorded as interrupted and run again. Run.NextSteps and Run.Status say
// where the run stands; Inspect, ReadLedger and Verify read a run from any
// process, and the runstate command (cmd/runstate) shows one to a person.
//
// # Evidence
//
// A stage's evidence is its inputs and its recorded outputs. File(path) is
// a file's content (path, unless absolute, is relative to
// Options.SourceDir, by default the working directory at Open; a path
// inside SourceDir is recorded relative to it, cleaned and with forward
// slashes, so the same checkout opened from elsewhere, or moved, keeps its
// evidence; one outside it is recorded absolute);
// Value(name, v) is the JSON of v; After(stage) is the outputs of another
// stage; ValidFor(d) makes the evidence expire. A done stage is redone when
// an input's fingerprint changed, when a recorded output is missing or
// altered, or when its evidence expired, and an invalidate record says
// which. Inputs are hashed at Begin and again at Complete: an input that
// changed while the stage ran makes Complete return ErrStale rather than
// record stale work as complete.
//
// After(stage) is that stage's output bytes (each output's path, SHA-256
// and size): a stage redone with the same output bytes does not redo the
// stages after it, and one whose output differs on every run (a timing, a
// date, a random id, map order) redoes every stage after it, every time.
// Normalise such output, or keep it out of the recorded outputs.
//
// Stage.Await ends the attempt as awaiting a person, and returns an error
// wrapping ErrNeedsPerson: returning that error from Do's fn records an
// await, not a failure (Do records nothing more for an attempt fn ended,
// and returns nil only when it completed).
//
// The library runs no processes and kills none: when a program is killed,
// the child processes its stages started (a go test, a model server) run
// on, and may still write while the next session redoes their stage. Run
// the program in its own process group and stop the group ('setsid prog',
// then 'kill -9 -- -PGID'), or on Linux set SysProcAttr.Pdeathsig on each
// child so that it dies with its parent.
//
// # The crash guarantee
//
// What each call has made durable when it returns, and what is left after
// the process is killed (SIGKILL, at any instruction) or the machine loses
// power:
//
//	call                         durable on return   process killed   power lost
//	Open, creating a run         the create record   kept             kept
//	Open, resuming               nothing (a)         kept             may be lost (b)
//	Run.Plan, Skip, Approve,     its record          kept             kept
//	  Invalidate, Resolve
//	Run.Begin (and Do's begin)   nothing (a)         kept             may be lost (b)
//	Stage.WriteFile, Output      nothing (c)         the file whole   may be lost (c)
//	Stage.Complete, Fail,        its record          kept             kept; outputs
//	  Await; Do returning nil                                         may be lost (c)
//	Run.Effect, before Do        the intent          kept             kept
//	Run.Effect, on return        the receipt         kept             kept
//	Run.Close                    the whole ledger    kept             kept
//	next-steps.txt, manifest     never synced (d)    whole (d)        may be behind (d)
//
//	(a) The record (open, begin) is in the ledger, written with one write(2),
//	    but not synced: nothing was promised yet. The next durable record's
//	    sync covers it.
//	(b) As if the session never opened, or the stage never began: nothing
//	    acknowledged is lost.
//	(c) Outputs are replaced atomically (a temp file or an unnamed file,
//	    then a rename or link: a killed write leaves the old file or the
//	    new one, never a part) and not synced. Their hashes are in the
//	    complete record, so a Begin or Do that finds one missing or altered
//	    redoes the stage.
//	(d) Projections of the ledger, replaced atomically and rebuilt by the
//	    next Open when behind. next-steps.txt is current when an
//	    acknowledging call returns; begins alone show in it at the stage's
//	    end, or after 50 ms. manifest.json is written on Open, on Close and
//	    at most every Options.ManifestInterval.
//
// Durable means that the record's bytes were fdatasync'd, in the ledger or
// in logs/ledger.wal, whichever the Run measures to be faster on its file
// system; the ledger gets the record first either way, so after a killed
// process logs/ledger.jsonl alone holds every acknowledged record. After a
// power loss the ledger may end before records that only logs/ledger.wal
// holds: the next Open (or 'runstate repair') copies them back before it
// does anything else, and Inspect, ReadLedger and Verify read them from
// there meanwhile (Verify names them as a problem). A failed fsync is never
// retried: the Run turns read-only (ErrReadOnly), because the kernel may
// already have dropped the data. A failed write (a full disk) returns a
// *WriteError and acknowledges nothing.
//
// A half-written last line (one without its '\n', however long) was never
// acknowledged: readers ignore it, and the next writer moves it aside
// (logs/ledger.jsonl.torn-<time>) and cuts it off. Any other bad line, the
// last one too (a torn append cannot end in '\n'), a crc that does not
// match, a gap in seq or a broken prev chain is corruption: Open fails with
// a *CorruptError naming the file, line and byte offset, and writes
// nothing. An unknown format version is ErrVersion.
//
// A ledger that ends, on a whole line, before records manifest.json shows
// were acknowledged (a stage's complete, skip, fail or await, an effect's
// intent, confirmation or resolution; begins, opens and closes are not
// proof, since a power loss may drop a begin the manifest already showed)
// lost them: restored from an old backup, copied badly, cut by a file
// system that lost its end. When logs/ledger.wal does not hold them,
// Open, Inspect, NextSteps and Repair refuse it with a *CorruptError that
// says how many records are missing, and rebuild nothing: the projections
// are the last trace of those records. Verify reports it as lost records.
// Restore the ledger from a backup, or accept the loss with 'runstate
// repair -accept-loss' (RepairOptions.AcceptLoss), which keeps the old
// projections aside.
//
// runstate opens its own files (logs/, its files and directories, and
// manifest.json) only where they are: Open and Repair refuse a run in which
// one of them is a symbolic link, a FIFO or a device, a file where runstate
// keeps a directory (logs/tmp, say) or a directory where it keeps a file
// other than a projection, naming it and saying what to do (ErrInvalid).
// The readers (Inspect, NextSteps, ReadLedger, Verify) do not follow such
// a link either, so that a run directory from elsewhere cannot make them
// read a file outside it: a linked logs/, ledger or journal fails them
// with Open's error, and a linked projection is not read (Verify reports
// it). To keep logs/ on another disk, mount it there. An output may not
// name them in any spelling a case-insensitive file system takes for
// theirs (LOGS/ledger.jsonl, Manifest.JSON, manifest.json.), nor reach them
// through a symbolic link, nor use a name Windows reserves for a device
// (NUL, CON, COM1 ...). Every file runstate creates, outputs included, gets
// the ledger's group and other permission bits at most (less the umask):
// after 'chmod 600 logs/ledger.jsonl' the run stays private, and the next
// Open brings runstate's older files (the journal, the projections, torn
// tails and backups) down to the ledger's bits.
//
// Runs assume a local file system: flock is not safe over NFS.
//
// # Concurrency
//
// Any number of goroutines and processes may share one run. Appends are
// serialized by the lock on logs/ledger.lock, and concurrent calls in one
// process share one write and one fsync (group commit: how batches form,
// and how long a stage's end may wait to share an fsync, is in commit.go
// and commitpolicy.go). A
// stage begun by a live session is ErrBusy for everyone else; one begun by
// a session that died (its lock in logs/sessions can be taken) is recorded
// as interrupted and may be begun again. A session counts as dead only on
// proof: its lock can be taken, or it closed, or its lock file is missing
// and its open record names this host and a pid that no longer exists. A
// lock file a person removed proves nothing (the session stays alive, and
// the log says so); recreate the empty file to declare a session gone.
// Inspect, ReadLedger and Verify read a run without a lock and without
// writing.
//
// Calls that take a context wait for logs/ledger.lock as long as it
// allows (Open, Close and a stage's end as long as Options.LockTimeout
// allows); a call that gives up records nothing and returns an error that
// names the pid holding the lock (from /proc/locks on Linux) or the run's
// open sessions. A wait of more than 2 seconds is logged with the holder.
// A stage whose end record could not be written that way (Do returned the
// error) does not stay running: the next Begin or Do of it in the Run
// records the attempt as interrupted and begins it again. A Run that
// turns read-only (a failed fsync; for a store shared across machines, a
// lost session: ErrSessionLost) cancels its running stages' contexts,
// the ctx Do passes to fn and Stage.Context, with that error as the cause.
//
// Open creates a run only where there is none: a missing, empty or
// unreadable ledger beside manifest.json, the handoff, session lock files
// or artifacts is a *CorruptError, never a new run. Before each batch that
// acknowledges a record, a session checks that logs/ledger.jsonl and
// logs/ledger.wal are still the files it opened; when one was deleted,
// renamed or replaced, the Run turns read-only.
//
// # Stores
//
// Open keeps a run in a run directory: the file store, whose files are
// listed below. OpenStore runs the same Run on any Store, an interface
// another module may implement (pgstore keeps runs in PostgreSQL, for a
// fleet of agents on several machines; runstatetest has one in memory);
// store.go says what a Store must guarantee. Outputs stay files in a local
// directory either way. InspectStore, NextStepsStore, ReadStore and
// VerifyStore read a run in any Store as Inspect, NextSteps, ReadLedger and
// Verify read a run directory. The crash guarantee above is the file
// store's; another store's durable point is its Batch.Sync (for a
// database, a synchronous COMMIT).
//
// # The run directory (format version 1)
//
// Everything in it is plain text that cat and jq can read, except the
// journal:
//
//	logs/ledger.jsonl              the execution ledger: the only source of truth
//	logs/next-steps.txt            the handoff a fresh session reads first
//	manifest.json                  a snapshot: stages, artifacts, effects, metrics
//	logs/ledger.wal                the journal (256 KiB, preallocated, overwritten
//	                               in place) that makes batches durable where that
//	                               is faster; do not delete it while a power loss
//	                               may have left records only there
//	logs/ledger.lock               the writers' lock file (flock(2) on Unix,
//	                               LockFileEx on Windows); never holds data
//	logs/sessions/<id>.lock        held locked by each open session; removed by Close
//	logs/handoff/<id>.0, .1        each open session's two copies of next-steps.txt,
//	                               one of them hard-linked as it; removed by Close
//	logs/handoff/<id>.new          the second name a copy gets while it is renamed
//	                               over next-steps.txt (for an instant)
//	logs/tmp/                      temp files of atomic writes, <session>-<random>;
//	                               the next Open removes what a killed write left
//	logs/ledger.jsonl.torn-<time>  a torn last line, moved aside before the cut
//	logs/ledger.jsonl.bak-<time>   the whole ledger, kept by 'runstate repair
//	                               -truncate-at' before it cuts
//	artifacts/...                  outputs, wherever the stages write them
//
// logs/ledger.jsonl holds one JSON object a line, each ended by '\n', in
// UTF-8. Writers put "seq", "at" and "ev" first and "prev", then "crc",
// last; readers accept fields in any order and ignore unknown ones, but
// match keys exactly: a key given twice in an object, or one that differs
// from a known field only by case ("EV", which encoding/json would read as
// ev and jq would not), is corruption. The fields:
//
//	seq      1, 2, 3 … with no gaps: the total order of events
//	at       RFC 3339 UTC time with nanoseconds
//	ev       the event (below)
//	session  the id (a UUID) of the session that wrote the record
//	stage    the stage name, for stage events
//	attempt  1, 2 … counting every begin of the stage in the run (at most 2^31-1)
//	inputs   {name: "sha256:<hex>"}: the evidence the stage started from
//	outputs  [{"path", "sha256", "size"}], paths relative to the run directory
//	key      the idempotency key, for effect events
//	class    for fail: retryable, person or fatal
//	error, reason, note, by   text
//	data     free JSON: the run identity (create), pid and host (open),
//	         the stage list (plan), a request or receipt (effects)
//	prev     hex SHA-256 of the previous line's bytes without its '\n'; ""
//	         on seq 1. Any edit, deletion or reordering breaks the chain.
//	crc      8 lowercase hex digits: the CRC-32C (Castagnoli) of the line's
//	         bytes before its ,"crc":" — the last field, so the line ends
//	         with ,"crc":"xxxxxxxx"}. A flipped bit in the last line, which
//	         no later prev covers, fails it. Lines written before runstate
//	         added it have none and still read; a line after one that has
//	         it must have it too, so a runstate release from before the
//	         field must not append to a ledger a later one wrote. (Readers
//	         that ignore unknown fields, as this format always asked, read
//	         it unchanged: still format 1.)
//
// What a record may hold, so that every record acknowledged reads back
// (the reader refuses a line longer than 16 MiB, its '\n' included, or
// JSON nested deeper than 10,000 levels): free text (error, reason, note,
// by) of at most 64 KiB, longer text being cut to its first bytes followed by
// "… [cut: N bytes]", and each byte of it that is not valid UTF-8
// recorded (and shown) as U+FFFD; JSON values (a receipt, an effect's request, the
// plan, a stage's input set, the run's request, revision and environment)
// of at most 4 MiB, nested at most 200 levels (jq 1.6 stops at 256), with
// no key twice in an object, and effect keys of at most 4 KiB: a larger
// value is refused with ErrInvalid before anything is recorded. Write
// large results to an output file and record its path. The writer never
// appends a line the reader would refuse: such a record's call fails
// with ErrInvalid, and nothing else.
//
// The events:
//
//	create       seq 1 only; data = {id (UUIDv7), request, revision, environment, format: 1}
//	open, close  a session attaches (data: pid, host, revision, environment) / detaches
//	             cleanly (data: stages it found done, effects it deduplicated)
//	plan         data = the ordered stage names
//	begin        a stage attempt starts, with its input fingerprints
//	complete     it ended well, with its inputs and outputs
//	fail         it failed; class says what happens next (reason "disk full:
//	             ...": ENOSPC or EDQUOT, and reason "canceled: ...": Do's
//	             context ended, are not counted toward MaxAttempts)
//	skip         the stage is not needed (reason); it counts as done
//	interrupted  a later session found a begin whose session is gone (or,
//	             with no stage, a session gone without a close: data.session)
//	invalidate   a done stage's evidence no longer holds (reason names the
//	             changed input, the missing or altered output, or the
//	             expiry), or a person forced a redo (by)
//	await        the stage needs a person: a review (Stage.Await), a failure
//	             of class person, or retries exhausted
//	approve      a person cleared it (by, note)
//	intent       a side effect is about to be attempted (data: its request)
//	confirm      the receiving system confirmed it (data: the receipt), or
//	             a person resolved it as sent (by)
//	unconfirmed  its outcome is unknown: a Check or a person must settle it
//	             (reason "in-doubt": written by Open for an intent whose
//	             session died; the next Effect call asks Check first)
//	resolve      a person resolved it as not sent (by): it may be sent again
//
// logs/next-steps.txt is a short page of text whose first line names the
// ledger seq it reflects ("... as of ledger seq N ..."): the run's
// identity, progress, what just completed and its outputs, what runs next,
// the blockers with what clears each (what the next run does by itself,
// and the command a person runs where one must, naming the run directory
// by its absolute path, quoted for a shell), and where to look. Text from
// the records (names, errors, reasons, paths) is escaped as Go's
// strconv.Quote escapes it, without the quotes: \x1b for ESC, \u202e for a
// bidi override, \xff for a byte of invalid UTF-8, \\ for a backslash;
// the page holds no control character but its line breaks.
//
// manifest.json is a JSON object: format, id, request, revision,
// environment, created, seq, updated (when it was written), plan, stages
// (name, state, attempts, inputs, outputs, reason, error ...), artifacts
// (path, sha256, size, stage, seq), effects (their requests and receipts
// as compact JSON), sessions, metrics, and "ledger": the byte offset, end
// and hash of the last record it reflects; then what Open needs to
// resume without a replay: identity (the create record's data), last and
// last_done, top_plan and plans (when a stage planned work with
// Stage.Plan), and "sum", the hex SHA-256 of the object
// encoded with sum empty. Open resumes from it when its sum holds and the
// ledger still has, at that offset, a record with that hash, and replays
// only the records after it; otherwise (a manifest edited by hand, say) it
// replays the whole ledger. Verify always checks every line.
package runstate
