// Package storetest checks that a place to keep runs (a run directory, an
// in-memory store, a database) keeps runstate's guarantees, the way
// testing/fstest.TestFS checks an fs.FS: one call, every guarantee,
// failures that say which.
//
// A store's own test calls Run with a Factory that makes a fresh, empty
// run for each subtest and hands back a Harness on it. For a store that
// spans machines, such as pgstore, each session gets a working directory
// of its own, as if on another machine:
//
//	type pgHarness struct {
//		db  *pgstore.DB
//		run string
//	}
//
//	func (h pgHarness) Open(t testing.TB, opts *runstate.Options) (*runstate.Run, error) {
//		return h.db.Open(context.Background(), h.run, t.TempDir(), opts)
//	}
//	func (h pgHarness) Crash(_ testing.TB, run *runstate.Run) { runstatetest.Crash(run) }
//	func (h pgHarness) Lines(t testing.TB) [][]byte { return storetest.ReadLines(t, h.db.Store(h.run)) }
//	func (h pgHarness) Store(testing.TB) runstate.Store { return h.db.Store(h.run) } // a Reader
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t testing.TB) storetest.Harness {
//			return pgHarness{db: newTestDB(t), run: "conformance"} // a schema of its own
//		})
//	}
//
// The file store's harness opens one run directory for every session
// (runstate.OpenStore(runstate.NewFileStore(dir, opts), dir, opts)), and
// the memory store's opens one runstatetest.MemStore.
//
// Harness.Open starts a new session on the subtest's run each time it is
// called, as a new process would: Run opens several sessions on one run,
// from several goroutines at once, crashes some with Harness.Crash (and
// some mid-call with runstatetest.CrashAt, which ends the session through
// the same path as runstatetest.Crash), and reads the run's ledger with
// Harness.Lines to check what it holds. A store shared by several machines
// gives each session its own working directory (a machine); a store on one
// machine may give them all one directory. The suite never assumes either:
// an output a stage writes in one session's directory must be found by
// another session's Begin, from that directory or from the store.
//
// The subtests, each of which fails on its own:
//
//   - ConcurrentAppends: several sessions, several goroutines each, append
//     at once; seq stays gapless from 1, every prev is the SHA-256 of the
//     line before, no acknowledged record is missing, and every session
//     catches up (Refresh) to the same state.
//   - OneCompletePerAttempt: sessions race Do on shared stages; each stage
//     runs once, with one begin and one complete, and never two completes
//     for one attempt.
//   - Busy: a stage begun by a live session is ErrBusy for another session
//     (Begin and Do), also after the holder appended more; once the holder
//     closed, the stage is interrupted and begun again as attempt 2.
//   - InterruptedAfterCrash: a stage begun by a session that crashed is
//     recorded as interrupted, naming that session, and the next session
//     runs it again as attempt 2.
//   - StaleInput: an input file that changes while the stage runs makes
//     Complete return ErrStale, records no complete, and the stage is
//     redone.
//   - EffectOnce: an Effect's Do is called once per key, across sessions
//     racing for it, after the confirming session crashed, and after a
//     crash between the intent and Do or between Do and the confirm (with
//     Check).
//   - RoundTrips: Plan, Do (with an output), Skip, Await and Approve,
//     Invalidate, written in one session, read back by the next.
//   - SnapshotAndTail: the Status of a reopened Run (which resumes from the
//     store's snapshot and the records after it) equals the Status of a
//     full replay of the ledger's lines (runstate.Inspect on a directory
//     holding only them), and that of every live session after Refresh.
//   - LedgerVerifies: the run's lines, written to logs/ledger.jsonl in a
//     directory of their own, pass runstate.Verify with no problem in the
//     ledger: a store's ledger can always be exported as a run directory.
//   - StoreReaders (only when the Harness is a Reader): InspectStore on
//     a Store no session opened succeeds, again and again, while sessions
//     append, never going back; it equals a full replay of the lines, and
//     VerifyStore finds no problem in the records.
//   - PowerLoss (only when the Harness is a PowerLosser): after a power
//     loss every acknowledged record is still there, in a chain that
//     verifies, and the run opens and goes on.
//
// Every subtest ends by checking the chain of the ledger once more. The
// subtests run in parallel; under -race, on a loaded two-core machine, the
// suite takes about 1 s on the memory store, 2 to 4 s on the file store
// and 3 s on a local PostgreSQL.
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runstate/runstate"
)

// A Harness opens sessions on one run of the store under test and reads
// that run's ledger. Run calls its methods from several goroutines at
// once: they must be safe for concurrent use.
type Harness interface {
	// Open starts a new session on the harness's run, creating the run
	// when it is the first, as runstate.Open does for a directory (and
	// runstate.OpenStore for a store), with opts (never nil; the harness
	// may copy it and add its own settings). A store that spans machines
	// opens each session in a working directory of its own. The suite
	// calls Open from goroutines of its own too: report a failure by
	// returning it, not with t.Fatal.
	Open(t testing.TB, opts *runstate.Options) (*runstate.Run, error)

	// Crash ends run's session as a killed process would: no close
	// record, nothing more written, its liveness gone (a later session
	// finds it dead). For the file store and the memory store that is
	// runstatetest.Crash. No call on run is in flight when the suite
	// calls it.
	Crash(t testing.TB, run *runstate.Run)

	// Lines returns the lines of the run's ledger as they stand, in
	// order, each without its '\n', as runstate.ReadLedger would read
	// them from a run directory: every record appended so far and
	// visible to readers, a torn tail left out. The suite may keep and
	// modify the slices it gets.
	Lines(t testing.TB) [][]byte
}

// A Factory makes a fresh, empty run of the store under test for one
// subtest and returns a Harness on it. It is called once per subtest,
// from parallel subtests; it cleans up after itself with t.Cleanup (the
// sessions the suite opened are closed before those cleanups run).
type Factory func(t testing.TB) Harness

// A PowerLosser is a Harness that can simulate a power loss: every line
// appended but not yet made durable (Batch.Sync) is dropped, and every
// open session on the run dies with it, as Harness.Crash would end it.
// Run adds the PowerLoss subtest for it.
type PowerLosser interface {
	Harness
	// PowerLoss drops what was not made durable and ends every open
	// session on the run, as PowerLosser says: each one's next append
	// must fail. The suite calls it from the subtest's goroutine, with no
	// call in flight; it may fail t with t.Fatal.
	PowerLoss(t testing.TB)
}

// A Reader is a Harness that also hands out a runstate.Store on its run
// that no session opened, as a status command reads a run: the suite then
// checks that the store-generic readers (runstate.InspectStore,
// runstate.VerifyStore) see what a full replay of the ledger sees.
type Reader interface {
	Harness
	// Store returns a new runstate.Store on the harness's run, which the
	// suite reads but never opens or closes. The suite calls it from
	// goroutines of its own too, at once: it must be safe for concurrent
	// use and not call t.Fatal.
	Store(t testing.TB) runstate.Store
}

// ReadLines returns the lines of the run that s holds, read with
// s.Read from the start, each without its '\n': a Harness's Lines for a
// store whose Read passes every line (a torn tail left out). It writes
// nothing. It fails t with t.Fatalf when the read fails, so call it from
// the goroutine running the test, as the suite calls Harness.Lines; the
// read itself is safe for concurrent use as Store.Read is.
func ReadLines(t testing.TB, s runstate.Store) [][]byte {
	t.Helper()
	var lines [][]byte
	_, err := s.Read(context.Background(), runstate.Position{}, func(line []byte) error {
		lines = append(lines, bytes.Clone(line))
		return nil
	})
	if err != nil {
		t.Fatalf("read the lines of %s: %v", s, err)
	}
	return lines
}

// Run runs the conformance suite on the store that newHarness opens,
// each check as a subtest of t (t.Run), in parallel. It returns when all
// are done; failures are reported through t, each naming the guarantee
// it breaks.
func Run(t *testing.T, newHarness Factory) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"ConcurrentAppends", testConcurrentAppends},
		{"OneCompletePerAttempt", testOneCompletePerAttempt},
		{"Busy", testBusy},
		{"InterruptedAfterCrash", testInterruptedAfterCrash},
		{"StaleInput", testStaleInput},
		{"EffectOnce", testEffectOnce},
		{"RoundTrips", testRoundTrips},
		{"SnapshotAndTail", testSnapshotAndTail},
		{"LedgerVerifies", testLedgerVerifies},
		{"StoreReaders", testStoreReaders},
		{"PowerLoss", testPowerLoss},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			_, lossy := h.(PowerLosser)
			_, reader := h.(Reader)
			switch {
			case tc.name == "PowerLoss" && !lossy:
				t.Skip("the harness is not a PowerLosser: it cannot simulate a power loss")
			case tc.name == "StoreReaders" && !reader:
				t.Skip("the harness is not a Reader: it hands out no Store to read")
			}
			tc.fn(t, h)
			if !t.Failed() {
				chain(t, h.Lines(t))
			}
		})
	}
}

// request is the Request of every run the suite creates.
const request = "storetest conformance"

// options returns the Options the suite opens every session with: the
// suite's request, and a lock wait that ends a store that deadlocks
// instead of hanging the test.
func options() *runstate.Options {
	return &runstate.Options{Request: request, LockTimeout: time.Minute}
}

// testContext returns a context that ends well before the test's own
// deadline, so that a store that hangs fails with a message.
func testContext(t *testing.T) context.Context {
	d := 2 * time.Minute
	if dl, ok := t.Deadline(); ok && time.Until(dl) < 2*d {
		d = time.Until(dl) / 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// open starts a session through h and closes it when the test ends
// (a crashed session's Close does nothing).
func open(t *testing.T, h Harness) *runstate.Run {
	t.Helper()
	run, err := h.Open(t, options())
	if err != nil {
		t.Fatalf("open a session: %v", err)
	}
	t.Cleanup(func() { _ = run.Close() })
	return run
}

// closeRun closes run and fails the test when Close fails.
func closeRun(t *testing.T, run *runstate.Run) {
	t.Helper()
	if err := run.Close(); err != nil {
		t.Fatalf("close session %s: %v", run.Session(), err)
	}
}

// chain checks the ledger's lines as every reader does: each line a JSON
// record whose seq is its line number and whose prev is the hex SHA-256
// of the line before ("" on the first). It reports each break through t
// and returns the records it could parse, in order.
func chain(t *testing.T, lines [][]byte) []runstate.Record {
	t.Helper()
	recs := make([]runstate.Record, 0, len(lines))
	prev := ""
	bad := 0
	for i, line := range lines {
		var rec runstate.Record
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Errorf("ledger line %d is not a JSON record: %v: %.200q", i+1, err, line)
			bad++
		} else {
			if rec.Seq != int64(i+1) {
				t.Errorf("ledger line %d has seq %d, want %d (a gap, a seq used twice, or lines out of order)", i+1, rec.Seq, i+1)
				bad++
			}
			if rec.Ev == "create" && i > 0 {
				t.Errorf("ledger line %d is a second create record: two sessions created the run", i+1)
				bad++
			}
			if rec.Prev != prev {
				t.Errorf("ledger line %d (seq %d): prev %q is not the SHA-256 of line %d (%q): the hash chain is broken", i+1, rec.Seq, rec.Prev, i, prev)
				bad++
			}
			recs = append(recs, rec)
		}
		sum := sha256.Sum256(line)
		prev = hex.EncodeToString(sum[:])
		if bad >= 5 {
			t.Errorf("ledger: giving up after %d broken lines of %d", bad, len(lines))
			break
		}
	}
	if len(lines) == 0 {
		t.Errorf("ledger: no lines at all")
	} else if len(recs) > 0 && recs[0].Ev != "create" {
		t.Errorf("ledger line 1 is %q, want the create record", recs[0].Ev)
	}
	return recs
}

// records checks the chain of h's ledger and returns its records.
func records(t *testing.T, h Harness) []runstate.Record {
	t.Helper()
	return chain(t, h.Lines(t))
}

// exportRun writes lines as logs/ledger.jsonl of a new directory, the
// run directory a store's ledger exports to, and returns the directory.
func exportRun(t *testing.T, lines [][]byte) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	var data []byte
	for _, line := range lines {
		data = append(append(data, line...), '\n')
	}
	if err := os.WriteFile(filepath.Join(dir, "logs", "ledger.jsonl"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// attemptKey names one attempt of a stage.
type attemptKey struct {
	stage   string
	attempt int
}

// countEv counts the records of event ev by stage and attempt.
func countEv(recs []runstate.Record, ev string) map[attemptKey]int {
	n := map[attemptKey]int{}
	for _, rec := range recs {
		if rec.Ev == ev {
			n[attemptKey{rec.Stage, rec.Attempt}]++
		}
	}
	return n
}

// find returns the records of event ev for stage (or effect key) name.
func find(recs []runstate.Record, ev, name string) []runstate.Record {
	var out []runstate.Record
	for _, rec := range recs {
		if rec.Ev == ev && (rec.Stage == name || rec.Key == name) {
			out = append(out, rec)
		}
	}
	return out
}
