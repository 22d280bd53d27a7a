// Package runstate gives agent programs durable, restartable run state: a
// run directory whose files say, in seconds, what is complete, what
// evidence is still valid and what is safe to do next, so that a session
// that ends (a killed process, a restarted server, a full context window)
// can be followed by a fresh one that neither redoes finished work nor
// repeats a side effect.
//
// # Using it
//
// Open a run directory, Plan the stages, and run each stage with Do (or
// Begin, then Complete or Fail). Each stage reads its inputs, does its
// work, writes its outputs and checkpoints:
//
//	run, err := runstate.Open(dir, &runstate.Options{Request: "add tests for the billing parser"})
//	if err != nil { ... }
//	defer run.Close()
//	run.Plan(ctx, "inspect", "plan", "execute", "verify")
//	err = run.Do(ctx, "plan", func(ctx context.Context, st *runstate.Stage) error {
//		return st.WriteFile("artifacts/plan.md", plan)
//	}, runstate.File("src/parser.go"), runstate.After("inspect"))
//
// Do returns nil at once, without calling fn, when the stage is complete and
// its evidence still holds: the same input fingerprints, every recorded
// output present with its recorded SHA-256, and not expired (ValidFor).
// Otherwise the stage is invalidated with a reason ("input src/parser.go
// changed") and run again. Side effects go through Run.Effect, which
// records an intent before the effect and its receipt after, so that a
// confirmed effect is never repeated.
//
// # The run directory (format version 1)
//
// Everything in it is plain text that cat and jq can read:
//
//	logs/ledger.jsonl        the execution ledger: the only source of truth
//	logs/next-steps.txt      the handoff a fresh session reads first
//	manifest.json            a snapshot: stages, artifacts, effects, metrics
//	logs/ledger.lock         the writers' lock file; never holds data
//	logs/sessions/<id>.lock  held locked by each open session
//	logs/tmp/                temp files of atomic writes, named <session>-<random>
//	logs/handoff/<id>.0, .1  each open session's two copies of next-steps.txt,
//	                         one of them hard-linked as it; gone after Close
//	logs/ledger.jsonl.torn-* torn last lines moved aside by a writer
//	artifacts/...            outputs, wherever the stages write them
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
//	attempt  1, 2 … counting every begin of the stage in the run
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
// (the reader refuses a line longer than 16 MiB, or JSON nested deeper
// than 10,000 levels): free text (error, reason, note, by) of at most
// 64 KiB, longer text being cut to its first bytes followed by
// "… [cut: N bytes]"; JSON values (a receipt, an effect's request, the
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
//	fail         it failed; class says what happens next
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
//	resolve      a person resolved it as not sent (by): it may be sent again
//
// logs/next-steps.txt is a short page of text whose first line names the
// ledger seq it reflects ("... as of ledger seq N ..."): the run's
// identity, progress, what just completed and its outputs, what runs next,
// the blockers with the command that clears each, and where to look.
//
// manifest.json is a JSON object: format, id, request, revision,
// environment, created, seq, plan, stages (name, state, attempts, inputs,
// outputs, reason, error ...), artifacts (path, sha256, size, stage, seq),
// effects, sessions, metrics, and "ledger": the byte offset, end and hash
// of the last record it reflects.
//
// # The crash guarantee
//
// Appends are made under an exclusive lock on logs/ledger.lock (flock(2) on
// a descriptor held open for the session on Unix, gofrs/flock's LockFileEx on
// Windows; session locks use gofrs/flock everywhere) plus a mutex, as one
// write of whole lines. A record that acknowledges
// something — complete, fail, skip, plan, await, approve, invalidate,
// intent, confirm, create — is durable before the call that wrote it
// returns; a begin or open record is not (nothing was promised yet; a later
// fsync covers it). Durable means one of two things, whichever the Run
// measures to be faster on its file system: the ledger was fdatasync'd, or
// the same bytes were written over logs/ledger.wal, a fixed-size,
// preallocated file, and that was fdatasync'd (an overwrite writes no
// metadata: on ext4 with a journal it is about half an append's fdatasync;
// on ext4 without one it gains nothing, and the ledger's own fdatasync is
// used). The ledger gets the record first either way, with one write(2),
// so after a process is killed, or a clean Close (which fdatasyncs the
// ledger), logs/ledger.jsonl alone holds every acknowledged record. After a
// machine crash the ledger may end before records that only
// logs/ledger.wal holds: the next Open (or 'runstate repair') copies them
// back before anything else, and Inspect, ReadLedger and Verify read them
// from there meanwhile (Verify names them as a problem). Do not delete
// logs/ledger.wal while a machine crash may have left records in it.
// Concurrent appends in one process are group-committed:
// one lock, one write and one fsync for the batch; begins that come while
// the batch waits for its fsync are written meanwhile, under the same lock,
// and do not wait for it (unless they record another record the handoff
// must show, such as an interrupted attempt). When goroutines run short
// stages (shorter, on average, than an fsync takes), the group commit may
// hold a stage's end for up to one and a half fsyncs so that the
// goroutines it just let go, whose stages are running, share the next
// fsync instead of taking turns; a goroutine alone never waits for another, and none
// waits while the program's other goroutines keep every processor busy
// (it would cost more than it saves). A failed fsync is never retried:
// the Run turns read-only (ErrReadOnly), because the kernel may already
// have dropped the data.
//
// So, whenever a process dies: every acknowledged record is in the ledger
// (or, after a machine crash, in logs/ledger.wal until the next Open);
// a half-written last line (one without its '\n') was never acknowledged,
// and the next writer moves it aside to logs/ledger.jsonl.torn-<time> and
// cuts it off (readers just ignore it). Any other bad line, the last one
// too (a torn append cannot end in '\n'), a crc that does not match, a
// gap in seq or a broken prev chain is corruption: Open fails with a
// *CorruptError naming the file, line and byte offset, and writes
// nothing. An unknown format version is ErrVersion.
//
// next-steps.txt and manifest.json are projections of the ledger, replaced
// atomically (temp file, rename) without fsync. next-steps.txt is replaced
// under the lock after every append batch that holds a record other than
// a begin, so it is current when a checkpoint returns; a batch of begins
// alone leaves it for the stage's end, or for a timer that shows a stage
// still running after 50 ms (a session killed in that window leaves it
// behind by begin records only, which Verify accepts). manifest.json is
// replaced on Open, on Close and at most every
// Options.ManifestInterval. A projection left behind the ledger, torn or
// missing is rebuilt by the next Open. Open resumes from manifest.json when
// the ledger still has, at the recorded offset, a record with the recorded
// hash, and replays only the records after it; otherwise it replays the
// whole ledger. Verify always checks every line.
//
// Outputs written with Stage.WriteFile are replaced atomically but not
// fsync'd: their hashes are in the ledger, and a later Begin redoes the
// stage if an output did not survive. A temp file left by a killed write
// is removed by the next Open.
//
// Runs assume a local file system: flock over NFS is not safe.
//
// # Concurrency
//
// Any number of goroutines and processes may share one run. A stage begun
// by a live session is ErrBusy for everyone else; one begun by a session
// that died (its lock in logs/sessions can be taken) is recorded as
// interrupted and may be begun again. Inspect, ReadLedger and Verify read a
// run from any process without a lock and without writing.
package runstate
