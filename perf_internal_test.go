package runstate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countFS counts, through the file-system seam, the fsyncs runstate asks
// for, the ledger's writes and the bytes read from it, and how often
// logs/next-steps.txt is replaced.
type countFS struct {
	fileSystem
	commitSyncs  atomic.Int64 // Sync of logs/ledger.jsonl or logs/ledger.wal: what makes records durable
	walSyncs     atomic.Int64 // of those, Syncs of logs/ledger.wal
	otherSyncs   atomic.Int64 // Sync of any other file
	dirSyncs     atomic.Int64 // SyncDir
	ledgerWrites atomic.Int64 // Write to logs/ledger.jsonl
	ledgerRead   atomic.Int64 // bytes read from logs/ledger.jsonl
	ledgerStats  atomic.Int64 // Stat of logs/ledger.jsonl (fileSize seeks instead)
	handoffs     atomic.Int64 // renames over logs/next-steps.txt
	manifests    atomic.Int64 // renames over manifest.json
	syncDelay    time.Duration
	// ledgerDelay, walDelay: more delay for one of the two files only.
	ledgerDelay, walDelay time.Duration
	// delayOnly: a commit fsync is its delays alone, the file not synced
	// (a test of what the Run does with the times it measures, which a
	// disk other processes keep busy must not decide).
	delayOnly bool
	// inSync, when set, receives a value as each commit fsync starts;
	// hold, when set, is waited on before each commit fsync ends.
	inSync chan struct{}
	hold   chan struct{}
	// failWrites: that many next ledger writes fail with ENOSPC, writing
	// nothing.
	failWrites atomic.Int64
}

func newCountFS() *countFS { return &countFS{fileSystem: osFS{}} }

// Link makes countFS a linker, like osFS, so that the handoff is published
// as it is in production.
func (c *countFS) Link(oldname, newname string) error { return os.Link(oldname, newname) }

func (c *countFS) Rename(oldpath, newpath string) error {
	switch filepath.Base(newpath) {
	case filepath.Base(nextStepsFile):
		c.handoffs.Add(1)
	case manifestFile:
		c.manifests.Add(1)
	}
	return c.fileSystem.Rename(oldpath, newpath)
}

func (c *countFS) OpenFile(name string, flag int, perm fs.FileMode) (file, error) {
	f, err := c.fileSystem.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	base := filepath.Base(name)
	return &countFile{file: f, c: c, ledger: base == filepath.Base(ledgerFile), wal: base == filepath.Base(walFile)}, nil
}

func (c *countFS) SyncDir(dir string) error {
	c.dirSyncs.Add(1)
	return c.fileSystem.SyncDir(dir)
}

type countFile struct {
	file
	c      *countFS
	ledger bool
	wal    bool
}

func (f *countFile) Sync() error {
	if f.ledger || f.wal {
		f.c.commitSyncs.Add(1)
		if f.wal {
			f.c.walSyncs.Add(1)
		}
		if f.c.inSync != nil {
			f.c.inSync <- struct{}{}
		}
		if f.c.hold != nil {
			<-f.c.hold
		}
		time.Sleep(f.c.syncDelay)
		if f.wal {
			time.Sleep(f.c.walDelay)
		} else {
			time.Sleep(f.c.ledgerDelay)
		}
		if f.c.delayOnly {
			return nil
		}
	} else {
		f.c.otherSyncs.Add(1)
	}
	return f.file.Sync()
}

func (f *countFile) Write(p []byte) (int, error) {
	if f.ledger {
		if f.c.failWrites.Load() > 0 {
			f.c.failWrites.Add(-1)
			return 0, syscall.ENOSPC
		}
		f.c.ledgerWrites.Add(1)
	}
	return f.file.Write(p)
}

func (f *countFile) Stat() (fs.FileInfo, error) {
	if f.ledger {
		f.c.ledgerStats.Add(1)
	}
	return f.file.Stat()
}

func (f *countFile) Read(p []byte) (int, error) {
	n, err := f.file.Read(p)
	if f.ledger {
		f.c.ledgerRead.Add(int64(n))
	}
	return n, err
}

func (f *countFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.file.ReadAt(p, off)
	if f.ledger {
		f.c.ledgerRead.Add(int64(n))
	}
	return n, err
}

// genStages is how many stages a generated run cycles through.
const genStages = 100

// genRun writes a run directory whose ledger holds n records (n >= 3), the
// way a long pipeline leaves it: create, open, a plan of genStages stages,
// then begin and complete pairs cycling through the stages (each with one
// file input and one output, as Do with File and WriteFile writes them),
// a close and an open every 1,000 records, and a close at the end. With
// manifest it writes manifest.json for the last record, as Close does;
// without, there is none and Open must replay the whole ledger. Nothing
// is fsync'd: the files are fixtures.
//
// Every line is what the package's encoder (appendRecord) writes: each
// kind of line is encoded once, with marks where seq, attempt and prev
// go, and filled in for each record, so that a million records take a
// second or two (under the race detector too) rather than a minute. The
// state is kept by applying every record, as a replay would.
func genRun(dir string, n int, manifest bool) error {
	if n < 3 {
		return fmt.Errorf("genRun: want at least 3 records, not %d", n)
	}
	for _, d := range []string{sessionsDir, tmpDir} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.FromSlash(d)), 0o755); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, filepath.FromSlash(ledgerFile)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)

	st := newState()
	at := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)
	sum := func(s string) string {
		h := sha256.Sum256([]byte(s))
		return hex.EncodeToString(h[:])
	}
	session := func(i int) string { return fmt.Sprintf("01900000-0000-7000-8000-%012d", i) }
	const seqMark, attemptMark, prevMark = 987654321987, 123456789, "PREV"
	var line []byte
	var buf bytes.Buffer
	// emit appends rec, encoded from its template t (nil: encode it now).
	emit := func(rec *Record, t [][]byte) error {
		rec.Seq = st.pos.seq + 1
		rec.Prev = st.pos.hash
		if t == nil {
			buf.Reset()
			if err := appendRecord(&buf, rec); err != nil {
				return err
			}
			line = append(line[:0], buf.Bytes()...)
		} else {
			line = append(line[:0], t[0]...)
			line = strconv.AppendInt(line, rec.Seq, 10)
			line = append(line, t[1]...)
			line = strconv.AppendInt(line, int64(rec.Attempt), 10)
			line = append(line, t[2]...)
			line = append(line, rec.Prev...)
			line = append(line, t[3]...)
			n := len(line) - crcSuffix - 1
			line = append(appendCRC(line[:n], line[:n]), '\n')
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
		st.apply(rec)
		st.pos = chain{seq: rec.Seq, hash: lineHash(line[:len(line)-1]), offset: st.pos.offset + int64(len(line))}
		st.lastLen = int64(len(line))
		return nil
	}
	// template encodes rec with marks and cuts it where they are.
	template := func(rec Record) ([][]byte, error) {
		rec.Seq, rec.Attempt, rec.Prev = seqMark, attemptMark, prevMark
		buf.Reset()
		if err := appendRecord(&buf, &rec); err != nil {
			return nil, err
		}
		b := buf.Bytes()
		seqAt, attemptAt, prevAt := `"seq":`+strconv.Itoa(seqMark), `"attempt":`+strconv.Itoa(attemptMark), `"prev":"`+prevMark+`"`
		i := bytes.Index(b, []byte(seqAt)) + len(`"seq":`)
		j := bytes.Index(b, []byte(attemptAt)) + len(`"attempt":`)
		k := bytes.Index(b, []byte(prevAt)) + len(`"prev":"`)
		if i < len(`"seq":`) || j < i+len(seqAt) || k < j+len(attemptAt) {
			return nil, fmt.Errorf("genRun: unexpected field order in %s", b)
		}
		return [][]byte{
			append([]byte(nil), b[:i]...),
			append([]byte(nil), b[i+len(seqAt)-len(`"seq":`):j]...),
			append([]byte(nil), b[j+len(attemptAt)-len(`"attempt":`):k]...),
			append([]byte(nil), b[k+len(prevMark):]...),
		}, nil
	}

	stages := make([]string, genStages)
	for i := range stages {
		stages[i] = fmt.Sprintf("execute/file-%03d", i)
	}
	id, _ := json.Marshal(runIdentity{ID: "01900000-0000-7000-8000-ffffffffffff", Request: "generated run", Format: FormatVersion})
	open, _ := json.Marshal(openData{PID: 4242, Host: "bench"})
	plan, _ := json.Marshal(stages)
	sessions := 1
	if err := emit(&Record{Ev: evCreate, At: at, Session: session(sessions), Data: id}, nil); err != nil {
		return err
	}
	if err := emit(&Record{Ev: evOpen, At: at, Session: session(sessions), Data: open}, nil); err != nil {
		return err
	}
	if err := emit(&Record{Ev: evPlan, At: at, Session: session(sessions), Data: plan}, nil); err != nil {
		return err
	}
	// The begin and complete records of each stage, and their templates,
	// remade for each session.
	type pair struct {
		begin, complete   Record
		tbegin, tcomplete [][]byte
	}
	pairs := make([]pair, len(stages))
	newSession := func() error {
		for i, name := range stages {
			in := map[string]string{"src/" + name + ".go": "sha256:" + sum("in"+name)}
			out := []Output{{Path: "artifacts/" + name + ".txt", SHA256: sum("out" + name), Size: int64(100 + i)}}
			p := &pairs[i]
			p.begin = Record{At: at, Ev: evBegin, Session: session(sessions), Stage: name, Inputs: in}
			p.complete = Record{At: at, Ev: evComplete, Session: session(sessions), Stage: name, Inputs: in, Outputs: out}
			var err error
			if p.tbegin, err = template(p.begin); err != nil {
				return err
			}
			if p.tcomplete, err = template(p.complete); err != nil {
				return err
			}
		}
		return nil
	}
	if err := newSession(); err != nil {
		return err
	}
	opened := st.pos.seq
	for i := 0; st.pos.seq < int64(n); i++ {
		left := int64(n) - st.pos.seq
		switch {
		case left == 1:
			err = emit(&Record{Ev: evClose, At: at, Session: session(sessions), Data: json.RawMessage(`{}`)}, nil)
		case left == 2:
			err = emit(&Record{Ev: evSkip, At: at, Session: session(sessions), Stage: "cleanup", Reason: "nothing to clean"}, nil)
		case st.pos.seq-opened >= 1000:
			if err = emit(&Record{Ev: evClose, At: at, Session: session(sessions), Data: json.RawMessage(`{"skipped":3}`)}, nil); err == nil {
				sessions++
				at = at.Add(time.Minute)
				if err = newSession(); err == nil {
					err = emit(&Record{Ev: evOpen, At: at, Session: session(sessions), Data: open}, nil)
				}
				opened = st.pos.seq
			}
		default:
			p := &pairs[i%len(pairs)]
			p.begin.Attempt = st.stage(p.begin.Stage).Attempt + 1
			p.complete.Attempt = p.begin.Attempt
			if err = emit(&p.begin, p.tbegin); err == nil {
				err = emit(&p.complete, p.tcomplete)
			}
		}
		if err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if !manifest {
		return nil
	}
	data, err := st.encodeManifest(at)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, manifestFile), data, 0o644)
}

// GenRunForTest is genRun, for the black-box benchmarks in bench_test.go.
var GenRunForTest = genRun

func openCounted(t testing.TB, dir string, c *countFS, o Options) *Run {
	t.Helper()
	if o.Request == "" {
		o.Request = "perf"
	}
	o.fs = c
	r, err := Open(dir, &o)
	require.NoError(t, err)
	return r
}

func smallDo(ctx context.Context, r *Run, name string) error {
	return r.Do(ctx, name, func(ctx context.Context, st *Stage) error {
		return st.WriteFile("artifacts/"+name+".txt", []byte("output of "+name))
	})
}

// TestOneFsyncPerCheckpoint counts, through the file-system seam, every
// fsync a run asks for: a checkpoint (Do with one output) is exactly one
// fsync, of the journal (logs/ledger.wal). The begin record, the output
// file, next-steps.txt and manifest.json are not synced. Creating a run
// syncs its create record and the new journal's zeros; resuming one syncs
// nothing; Plan and each of an effect's two records sync once; Close
// syncs its close record, then the ledger itself.
func TestOneFsyncPerCheckpoint(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := newCountFS()
	// The manifest after every append, too; every batch through the ring
	// (the measured choice is TestDurableWayMeasured's).
	r := openCounted(t, dir, c, Options{ManifestInterval: -1, durable: durableRingOnly})
	assert.Equal(t, int64(1), c.commitSyncs.Load(), "Open of a new run: the create record")
	assert.Equal(t, int64(1), c.otherSyncs.Load(), "Open of a new run: the new journal")
	assert.Equal(t, int64(1), c.manifests.Load(), "Open writes manifest.json once")
	dirs := c.dirSyncs.Load() // Open of a new run makes the names of its files durable
	stats := c.ledgerStats.Load()
	require.NoError(t, r.Plan(ctx, "a", "b"))
	assert.Equal(t, int64(2), c.commitSyncs.Load(), "Plan")

	const n = 20
	for i := 0; i < n; i++ {
		require.NoError(t, smallDo(ctx, r, "s"+strconv.Itoa(i)))
		assert.Equal(t, int64(2+i+1), c.commitSyncs.Load(), "checkpoint %d", i)
		assert.Equal(t, int64(2+i+1), c.walSyncs.Load(), "checkpoint %d: the journal's fsync, not the ledger's", i)
	}
	_, err := r.Effect(ctx, "ticket", Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return json.RawMessage(`{"id":1}`), nil
	}})
	require.NoError(t, err)
	assert.Equal(t, int64(2+n+2), c.commitSyncs.Load(), "an effect: intent and confirm")
	assert.Zero(t, c.ledgerRead.Load(), "no other writer: a checkpoint reads nothing of the ledger")
	// A stat of the ledger before each batch would make every append
	// update its inode with a fine-grained time (Linux 6.13+): fileSize.
	assert.Equal(t, stats, c.ledgerStats.Load(), "no stat of the ledger after Open")
	require.NoError(t, r.Close())
	assert.Equal(t, int64(2+n+2+2), c.commitSyncs.Load(), "Close: the close record, then the ledger")
	assert.Equal(t, int64(2+n+2+1), c.walSyncs.Load(), "Close: the close record in the journal")
	assert.Equal(t, int64(1), c.otherSyncs.Load(), "no other file is synced")
	assert.Equal(t, dirs, c.dirSyncs.Load(), "no directory is synced after Open")

	c2 := newCountFS()
	r = openCounted(t, dir, c2, Options{})
	assert.Zero(t, c2.commitSyncs.Load()+c2.dirSyncs.Load()+c2.otherSyncs.Load(), "Open of an existing run syncs nothing")
	assert.Equal(t, int64(1), c2.manifests.Load(), "Open of an existing run writes manifest.json once")
	require.NoError(t, smallDo(ctx, r, "after-resume"))
	assert.Equal(t, int64(1), c2.commitSyncs.Load())
	require.NoError(t, r.Close())
	t.Logf("%d checkpoints: %d commit fsyncs in all (Open 1, Plan 1, effect 2, Close 2), %d directory fsyncs (Open of a new run); resumed: Open 0, one checkpoint 1, Close 2 = %d",
		n, c.commitSyncs.Load(), dirs, c2.commitSyncs.Load())
}

// TestGroupCommit runs 8 goroutines checkpointing at once: concurrent
// appends share one write and one fsync (fewer fsyncs than checkpoints),
// next-steps.txt is replaced once per write, and nothing is lost.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := newCountFS()
	c.syncDelay = time.Millisecond // a slow disk: writers pile up behind an fsync
	r := openCounted(t, dir, c, Options{})
	syncs0, writes0, handoffs0, flushes0 := c.commitSyncs.Load(), c.ledgerWrites.Load(), c.handoffs.Load(), r.c.lag.flushes.Load()
	const goroutines, each = 8, 10
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				assert.NoError(t, smallDo(ctx, r, fmt.Sprintf("g%d/s%d", g, i)))
			}
		}()
	}
	wg.Wait()
	syncs, writes, handoffs := c.commitSyncs.Load()-syncs0, c.ledgerWrites.Load()-writes0, c.handoffs.Load()-handoffs0
	flushes := r.c.lag.flushes.Load() - flushes0
	t.Logf("%d checkpoints (%d commits): %d ledger writes, %d fsyncs, %d next-steps.txt rewrites (%d by the lag timer)",
		goroutines*each, 2*goroutines*each, writes, syncs, handoffs, flushes)
	assert.Less(t, syncs, int64(goroutines*each), "group commit: fewer fsyncs than checkpoints")
	assert.Less(t, writes, int64(2*goroutines*each), "group commit: fewer writes than commits")
	// Every batch that holds a complete is synced and republishes the
	// handoff; a batch of begins alone does not (handoffLag).
	assert.Equal(t, syncs+flushes, handoffs, "one next-steps.txt rewrite per batch with a complete")
	require.NoError(t, r.Close())

	rep, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	s, err := Inspect(dir)
	require.NoError(t, err)
	complete := 0
	for _, st := range s.Stages {
		if st.State == StateComplete {
			complete++
		}
	}
	assert.Equal(t, goroutines*each, complete)
}

// TestBeginsJoinTheBatch: with goroutines checkpointing at once, the
// begin records of the stages that the last batch's goroutines go on to
// are written with the next batch, not each on its own while that batch
// waits for its fsync (a leader yields once before it takes a batch when
// the last batch woke other goroutines). On one P, without the yield,
// every begin after the first batch is a write of its own: 200 writes
// for 320 commits, every time.
//
// Another process taking the CPU makes the leader's yields slow, and a
// run that measures slow yields stops yielding, by design (cooperate): on
// a busy machine one run may write 160-170. So the best of three runs
// counts; without the yield every run writes 200.
func TestBeginsJoinTheBatch(t *testing.T) {
	ctx := context.Background()
	best, commits := int64(math.MaxInt64), int64(0)
	for try := 0; try < 3 && best > commits/2; try++ {
		t.Run("try", func(t *testing.T) {
			r, c := slowDiskOneP(t)
			writes0 := c.ledgerWrites.Load()
			n := inGoroutines(t, 8, 20, func(name string) error { return smallDo(ctx, r, name) })
			writes := c.ledgerWrites.Load() - writes0
			commits, best = 2*n, min(best, writes)
			t.Logf("%d commits (a begin and a complete per checkpoint): %d ledger writes; yield %v skipped %d", commits, writes, r.c.policy.yieldTime, r.c.policy.coopSkipped)
		})
	}
	assert.LessOrEqual(t, best, commits/2, "begins join the batches of completes (69-102 here; without the yield 200)")
}

// slowDiskOneP opens a run on a simulated slow disk (1 ms per fsync),
// counted, with GOMAXPROCS 1 until the test ends: on one P the order of
// concurrent commits is fixed, since the goroutines a batch wakes run
// until they wait and the disk is the only other thing that waits.
func slowDiskOneP(t *testing.T) (*Run, *countFS) {
	procs := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(procs) })
	c := newCountFS()
	c.syncDelay = time.Millisecond
	r := openCounted(t, t.TempDir(), c, Options{})
	t.Cleanup(func() { r.Close() })
	return r, c
}

// TestCooperateWhenBusy: while the program's own goroutines keep every
// processor busy, a leader's yield waits for a time slice (milliseconds),
// longer than the fsync it could save; cooperate then stops yielding and
// gathering, and only probes once in coopProbe batches.
//
// Whether the busy goroutines make the leader's yields slow is the Go
// scheduler's doing: in about one run of 200 checkpoints in seven, here,
// the yields stayed fast throughout (50 µs: the leader was never queued
// behind a busy goroutine), or became slow only in the last batches, and
// no batch had reason to skip one. So the test runs up to maxRounds such
// runs, each with busy goroutines of its own, until one has made yields
// slow and then skipped them; a cooperate that never gives up yielding
// fails every round.
func TestCooperateWhenBusy(t *testing.T) {
	const maxRounds = 8
	procs := runtime.GOMAXPROCS(2)
	defer runtime.GOMAXPROCS(procs)
	ctx := context.Background()
	c := newCountFS()
	c.syncDelay = time.Millisecond
	r := openCounted(t, t.TempDir(), c, Options{})
	defer r.Close()
	skipped := 0
	for round := 1; round <= maxRounds && skipped == 0; round++ {
		var stop atomic.Bool
		var hogs sync.WaitGroup
		for range 2 {
			hogs.Add(1)
			go func() { // CPU work of the program's own, never blocking
				defer hogs.Done()
				x := 0
				for !stop.Load() {
					for k := range 100_000 {
						x += k
					}
				}
				_ = x
			}()
		}
		n := inGoroutines(t, 8, 25, func(name string) error {
			return r.Do(ctx, fmt.Sprintf("r%d/%s", round, name), func(context.Context, *Stage) error { return nil })
		})
		stop.Store(true)
		hogs.Wait()
		r.c.mu.Lock()
		var yield, syncTime time.Duration
		skipped, yield, syncTime = r.c.policy.coopSkipped, r.c.policy.yieldTime, r.c.policy.syncTime
		r.c.mu.Unlock()
		t.Logf("round %d: %d checkpoints beside 2 busy goroutines: %d batches skipped the yield; a yield takes %v, an fsync %v",
			round, n, skipped, yield, syncTime)
	}
	assert.Positive(t, skipped, "yields that wait for a time slice are given up (%d rounds)", maxRounds)
}

// TestCooperateProbes drives cooperate: while a yield takes longer than an
// fsync it neither yields nor gathers, but for one batch in coopProbe,
// whose yield is measured; once yields are cheap again it gathers.
func TestCooperateProbes(t *testing.T) {
	r, begin, complete := queuedPair(t)

	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	r.c.policy.syncTime, r.c.policy.stageTime, r.c.policy.yieldTime = time.Millisecond, 10*time.Microsecond, 10*time.Millisecond
	for i := 1; i < coopProbe; i++ {
		r.c.queue = []*tx{complete, begin}
		r.cooperate(nil)
		assert.Equal(t, []*tx{complete, begin}, r.c.queue, "batch %d: not gathered", i)
		assert.Equal(t, 10*time.Millisecond, r.c.policy.yieldTime, "batch %d: no yield measured", i)
	}
	r.cooperate(nil) // the probe: a yield with nothing else to run is fast
	assert.Less(t, r.c.policy.yieldTime, 10*time.Millisecond, "the probe's yield is measured")
	assert.Greater(t, r.c.policy.yieldTime, r.c.policy.syncTime, "one fast yield does not outweigh slow ones")
	assert.Equal(t, []*tx{complete, begin}, r.c.queue, "the probe does not gather while yields are still slow")

	r.c.policy.yieldTime = 10 * time.Microsecond
	r.cooperate(nil)
	assert.Equal(t, []*tx{complete}, r.c.queue, "yields cheap again: the begin is written alone, the batch gathered")
	r.c.queue = nil
}

// TestCooperateOneSlowYield: a yield made slow once (as when the kernel
// runs another process meanwhile) does not make cooperate give up
// yielding; yields slow twice in a row (the program's own goroutines
// holding the processors) do.
func TestCooperateOneSlowYield(t *testing.T) {
	r, _, _ := queuedPair(t)
	slowYield := func() {
		gosched = func() { time.Sleep(5 * time.Millisecond) }
		defer func() { gosched = runtime.Gosched }()
		r.cooperate(nil)
	}

	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	for range 4 {
		r.cooperate(nil) // nothing else to run: fast
	}
	require.Less(t, r.c.policy.yieldTime, coopBusy)
	slowYield()
	assert.Less(t, r.c.policy.yieldTime, coopBusy, "one slow yield alone: still not busy (%v)", r.c.policy.yieldTime)
	r.cooperate(nil)
	slowYield()
	slowYield()
	assert.Greater(t, r.c.policy.yieldTime, coopBusy, "two slow yields in a row: busy")
	skipped := r.c.policy.coopSkipped
	r.cooperate(nil)
	assert.Equal(t, skipped+1, r.c.policy.coopSkipped, "busy: the next batch skips the yield")
}

// inGoroutines calls do with names g<g>/s<i> from goroutines goroutines,
// each times each, in order, and waits for them; it returns how many
// calls it made.
func inGoroutines(t *testing.T, goroutines, each int, do func(name string) error) int64 {
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				assert.NoError(t, do(fmt.Sprintf("g%d/s%d", g, i)))
			}
		}()
	}
	wg.Wait()
	return int64(goroutines * each)
}

// TestGatherOneFsyncForAll: 8 goroutines checkpointing short stages on a
// slow disk (1 ms fsync). The goroutines one batch wakes come back with
// their next stage's begin and, a little later, its complete; the leader
// writes those begins alone and waits (up to about one fsync) for the
// completes, so that one fsync covers every goroutine instead of half of
// them each (gatherBatch). Stages longer than an fsync make the waits run
// out, and gathering backs off: few waits are spent on them.
func TestGatherOneFsyncForAll(t *testing.T) {
	// Stages that write no file: an output file can take longer to
	// create than an fsync, on this machine right after many files were
	// deleted, and its goroutine then comes back late.
	ctx := context.Background()
	r, c := slowDiskOneP(t)

	// Alone, a goroutine never waits for another.
	for i := range 5 {
		require.NoError(t, smallDo(ctx, r, fmt.Sprintf("alone/s%d", i)))
	}
	assert.Zero(t, r.c.policy.gathered.Load()+r.c.policy.gatherLate.Load(), "a goroutine alone: no gathering")

	run := func(prefix string, stage time.Duration) (checkpoints, syncs int64) {
		syncs0 := c.commitSyncs.Load()
		n := inGoroutines(t, 8, 25, func(name string) error {
			return r.Do(ctx, prefix+"/"+name, func(context.Context, *Stage) error {
				time.Sleep(stage)
				return nil
			})
		})
		return n, c.commitSyncs.Load() - syncs0
	}
	// A machine busy with other processes can wake the goroutines late
	// (a gather's wait runs out: 63 fsyncs once, beside the whole suite
	// and two CPU-bound loops), never early: of up to three rounds, one
	// must show it. Without gathering every round takes 67-77.
	var n, syncs int64
	for round := range 3 {
		n, syncs = run(fmt.Sprintf("short%d", round), 0)
		t.Logf("short stages, round %d: %d checkpoints, %d fsyncs; %d waits ended with every goroutine back, %d ran out",
			round, n, syncs, r.c.policy.gathered.Load(), r.c.policy.gatherLate.Load())
		if syncs <= n/4 {
			break
		}
	}
	assert.Positive(t, r.c.policy.gathered.Load())
	assert.LessOrEqual(t, syncs, n/4, "an fsync covers most of the 8 goroutines (27-45 fsyncs for 200 here; 67-77 without gathering)")

	late0 := r.c.policy.gatherLate.Load()
	n, syncs = run("long", 5*time.Millisecond)
	late := r.c.policy.gatherLate.Load() - late0
	t.Logf("5 ms stages: %d checkpoints, %d fsyncs, %d waits ran out", n, syncs, late)
	// A wait that runs out can split the goroutines into two groups that
	// then take turns (about 60 fsyncs for 200 here, against 30); stages
	// longer than an fsync are not waited for (TestGatherWhen; without
	// that, 1-5 waits ran out here in 4 runs of 10).
	assert.LessOrEqual(t, late, int64(1), "stages longer than an fsync: no waiting for them")
}

// queuedPair opens a run and makes two transactions that append nothing,
// for tests that drive the leader's steps by hand: a begin (lazy) and a
// record to sync.
func queuedPair(t *testing.T) (r *Run, begin, complete *tx) {
	r, err := Open(t.TempDir(), &Options{Request: "leader"})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	noop := func(*state) ([]*Record, error) { return nil, nil }
	return r, &tx{fn: noop, lazy: true, done: make(chan struct{})}, &tx{fn: noop, sync: true, done: make(chan struct{})}
}

// TestGatherWhen drives gatherBatch itself: it waits for nothing while
// stages take longer than an fsync; otherwise it writes the begins alone
// and waits up to about one fsync for the records it expects.
func TestGatherWhen(t *testing.T) {
	r, begin, complete := queuedPair(t)
	noop := begin.fn
	closed := func(t *tx) bool {
		select {
		case <-t.done:
			return true
		default:
			return false
		}
	}

	r.c.mu.Lock()
	r.c.queue = []*tx{complete, begin}
	r.c.policy.syncTime, r.c.policy.stageTime = time.Millisecond, 5*time.Millisecond
	r.gatherBatch(nil)
	assert.Equal(t, []*tx{complete, begin}, r.c.queue, "stages longer than an fsync: the queue as it was")
	assert.False(t, closed(begin))

	// The leader's own begin: its stage runs only once the leader stops
	// leading, so no record is expected from it.
	r.c.policy.stageTime = 100 * time.Microsecond
	own := &tx{fn: noop, lazy: true, done: make(chan struct{})}
	r.c.queue = []*tx{complete, own}
	r.gatherBatch(own)
	assert.True(t, closed(own))
	assert.Equal(t, []*tx{complete}, r.c.queue)
	assert.Equal(t, int64(1), r.c.policy.gathered.Load(), "every record expected is there at once")
	assert.Zero(t, r.c.policy.gatherLate.Load())

	r.c.queue = []*tx{complete, begin}
	start := time.Now()
	r.gatherBatch(nil)
	waited := time.Since(start)
	assert.True(t, closed(begin), "the begin written alone, its goroutine let go")
	assert.Equal(t, []*tx{complete}, r.c.queue, "the records to sync still queued")
	assert.GreaterOrEqual(t, waited, 3*time.Millisecond/2, "waited one and a half fsyncs for the begin's goroutine to come back")
	assert.Equal(t, int64(1), r.c.policy.gatherLate.Load(), "it did not come back")
	assert.Equal(t, 8, r.c.policy.gatherOff, "gathering off for the next 8 batches")
	r.gatherBatch(nil)
	assert.Equal(t, 7, r.c.policy.gatherOff)
	r.c.queue = nil
	r.c.mu.Unlock()
}

// TestHandoffFiles checks how next-steps.txt is published without a new
// file per append: two handoff files per session, one of them also named
// logs/next-steps.txt; none left after Close; a killed session's removed
// by the next Open; and temp files where hard links fail.
func TestHandoffFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "perf"})
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		require.NoError(t, smallDo(ctx, r, "s"+strconv.Itoa(i)))
	}
	names := func() []string {
		ents, err := os.ReadDir(filepath.Join(dir, filepath.FromSlash(handoffDir)))
		require.NoError(t, err)
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	assert.ElementsMatch(t, []string{r.Session() + ".0", r.Session() + ".1"}, names())
	want, err := r.NextSteps()
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(nextStepsFile)))
	require.NoError(t, err)
	assert.Equal(t, want, string(got))
	ns, err := os.Stat(filepath.Join(dir, filepath.FromSlash(nextStepsFile)))
	require.NoError(t, err)
	linked := 0
	for _, name := range names() {
		fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(handoffDir), name))
		require.NoError(t, err)
		if os.SameFile(fi, ns) {
			linked++
		}
	}
	assert.Equal(t, 1, linked, "next-steps.txt is one of the two handoff files")
	require.NoError(t, r.Close())
	assert.Empty(t, names(), "Close removes the handoff files")
	seq, err := nextStepsSeq(dir)
	require.NoError(t, err)
	s, err := Inspect(dir)
	require.NoError(t, err)
	assert.Equal(t, s.Seq, seq, "next-steps.txt is current after Close")

	// A killed session leaves its handoff files; the next Open removes them.
	r, err = Open(dir, &Options{Request: "perf"})
	require.NoError(t, err)
	require.NoError(t, smallDo(ctx, r, "killed"))
	r.crash()
	require.Len(t, names(), 2)
	r, err = Open(dir, &Options{Request: "perf"})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{r.Session() + ".0"}, names(), "only the new session's")
	require.NoError(t, r.Close())

	// Without hard links (a fileSystem that is not a linker), next-steps.txt
	// is replaced through temp files, and still current.
	dir2 := t.TempDir()
	r, err = Open(dir2, &Options{Request: "perf", fs: noLinkFS{osFS{}}})
	require.NoError(t, err)
	require.NoError(t, smallDo(ctx, r, "a"))
	want, err = r.NextSteps()
	require.NoError(t, err)
	got, err = os.ReadFile(filepath.Join(dir2, filepath.FromSlash(nextStepsFile)))
	require.NoError(t, err)
	assert.Equal(t, want, string(got))
	ents, err := os.ReadDir(filepath.Join(dir2, filepath.FromSlash(handoffDir)))
	require.NoError(t, err)
	assert.Empty(t, ents)
	require.NoError(t, r.Close())
}

// noLinkFS is a fileSystem without hard links.
type noLinkFS struct{ fileSystem }

// TestNextStepsCheap checks what the handoff rendered after every append
// keeps up to date instead of scanning the state (the count of blockers,
// the time of the latest stage record) against a full scan, through
// blockers, failures, interruptions, unconfirmed effects and a manifest
// round trip; and that the page agrees with Status.
func TestNextStepsCheap(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := Open(dir, &Options{Request: "perf", MaxAttempts: 1})
	require.NoError(t, err)
	check := func(what string) {
		t.Helper()
		r.stMu.RLock()
		defer r.stMu.RUnlock()
		s := r.st
		assert.Equal(t, len(s.blockers(r.where)), s.blocking, "%s: blocking", what)
		var latest time.Time
		for _, st := range s.stages {
			if st.At.After(latest) {
				latest = st.At
			}
		}
		assert.True(t, latest.Equal(s.stageAt), "%s: stageAt %v, want %v", what, s.stageAt, latest)
		status := s.status("", r.where)
		page := s.nextSteps("DIR")
		assert.Contains(t, page, fmt.Sprintf("progress: %d of %d planned stages done", status.Done, status.Done+status.Remaining), what)
		if status.Next != "" {
			assert.Contains(t, page, "next:     "+status.Next+" (", what)
		}
		if n := len(status.Blockers); n > 0 {
			assert.Contains(t, page, fmt.Sprintf("blockers: %d\n", n), what)
		} else {
			assert.Contains(t, page, "blockers: none\n", what)
		}
	}
	check("new")
	var plan []string
	for i := 0; i < 12; i++ {
		plan = append(plan, "p"+strconv.Itoa(i))
	}
	require.NoError(t, r.Plan(ctx, plan...))
	for i := 0; i < 10; i++ {
		require.NoError(t, smallDo(ctx, r, plan[i]))
	}
	check("ten of twelve done")
	require.Error(t, r.Do(ctx, "p10", func(context.Context, *Stage) error { return errors.New("flaky") }))
	check("retries exhausted: awaiting")
	require.Error(t, r.Do(ctx, "x", func(context.Context, *Stage) error { return Fatal(errors.New("broken")) }))
	check("fatal")
	require.NoError(t, r.Approve(ctx, "p10", "ann", "try again"))
	check("approved")
	_, err = r.Effect(ctx, "mail", Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("timeout")
	}})
	require.ErrorIs(t, err, ErrUnconfirmed)
	check("unconfirmed effect")
	require.NoError(t, r.Resolve(ctx, "mail", Resolution{Sent: false, By: "ann"}))
	check("resolved")
	_, err = r.Begin(ctx, "hanging")
	require.NoError(t, err)
	r.crash()

	r, err = Open(dir, &Options{Request: "perf", MaxAttempts: 1})
	require.NoError(t, err)
	check("interrupted, resumed from the manifest")
	require.NoError(t, r.Invalidate(ctx, "x", "fixed"))
	check("invalidated")
	require.NoError(t, r.Close())
	r, err = Open(dir, &Options{Request: "perf"})
	require.NoError(t, err)
	check("reopened")
	require.NoError(t, r.Close())
}

// planView is what the handoff shows of the plan.
type planView struct {
	Done, Rest   []string
	NDone, NRest int
	Next         string
}

func viewOf(s *state) planView {
	d, next, r := s.planSummary()
	return planView{Done: d.names, NDone: d.n, Next: next, Rest: r.names, NRest: r.n}
}

// lookUpEvery is the plan summary made by looking up every planned stage,
// as the handoff did before the plan index.
func lookUpEvery(s *state) planView {
	var v planView
	for _, name := range s.plan {
		switch {
		case done(s.stages[name].State):
			if len(v.Done) < shortListMax {
				v.Done = append(v.Done, name)
			}
			v.NDone++
		case v.Next == "":
			v.Next = name
		default:
			if len(v.Rest) < shortListMax {
				v.Rest = append(v.Rest, name)
			}
			v.NRest++
		}
	}
	return v
}

// TestPlanIndex checks the handoff's plan summary, read through the plan
// index, against a look-up of every planned stage: over random plans (of
// sizes around the index's 64-bit words), random records about planned and
// unplanned stages, new plans, and the state a manifest round trip gives.
func TestPlanIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 1))
	evs := []string{evBegin, evComplete, evComplete, evSkip, evFail, evAwait, evApprove, evInterrupted, evInvalidate}
	classes := []string{"", ClassRetryable, ClassPerson, ClassFatal}
	norm := func(v planView) planView { // nil and empty lists are the same page
		if len(v.Done) == 0 {
			v.Done = nil
		}
		if len(v.Rest) == 0 {
			v.Rest = nil
		}
		return v
	}
	for _, size := range []int{0, 1, 8, 9, 63, 64, 65, 130, 1000} {
		s := newState()
		s.identity.ID = "plan-index"
		seq := int64(0)
		add := func(rec *Record) {
			seq++
			rec.Seq, rec.At, rec.Session = seq, time.Unix(seq, 0).UTC(), "s1"
			s.apply(rec)
		}
		plan := func(names []string) {
			data, err := json.Marshal(names)
			require.NoError(t, err)
			add(&Record{Ev: evPlan, Data: data})
		}
		var names []string
		for _, i := range rng.Perm(size) { // plan order is not name order
			names = append(names, "p"+strconv.Itoa(i))
		}
		plan(names)
		check := func(what string) {
			t.Helper()
			require.Equal(t, norm(lookUpEvery(s)), norm(viewOf(s)), "plan of %d, %s", size, what)
		}
		check("new plan")
		for step := range 4*size + 40 {
			stage := "unplanned" + strconv.Itoa(rng.IntN(3))
			if len(s.plan) > 0 && rng.IntN(10) > 0 {
				stage = s.plan[rng.IntN(len(s.plan))]
			}
			rec := &Record{Ev: evs[rng.IntN(len(evs))], Stage: stage, Attempt: 1, Reason: "r"}
			if rec.Ev == evFail {
				rec.Class, rec.Error = classes[rng.IntN(len(classes))], "e"
			}
			add(rec)
			if size < 100 || step%50 == 0 {
				check(fmt.Sprintf("step %d (%s %s)", step, rec.Ev, stage))
			}
			if rng.IntN(4*size+40) == 0 { // a new plan: some old stages, some new
				var next []string
				for _, n := range s.plan {
					if rng.IntN(3) > 0 {
						next = append(next, n)
					}
				}
				next = append(next, "new"+strconv.Itoa(step))
				rng.Shuffle(len(next), func(i, j int) { next[i], next[j] = next[j], next[i] })
				plan(next)
				check("replanned")
			}
		}
		check("end")
		s.pos = chain{seq: seq, hash: strings.Repeat("ab", 32), offset: 1000}
		s.lastLen = 100
		data, err := s.encodeManifest(time.Now())
		require.NoError(t, err)
		from, _, err := decodeManifest(data)
		require.NoError(t, err)
		require.Equal(t, norm(viewOf(s)), norm(viewOf(from)), "plan of %d: from the manifest", size)
		require.Equal(t, norm(lookUpEvery(from)), norm(viewOf(from)), "plan of %d: from the manifest", size)
	}
	// Plans only a ledger edited by hand holds: a name twice, an empty name.
	for _, names := range [][]string{{"a", "b", "a", "c"}, {"", "b", "c"}, {"a", ""}} {
		s := newState()
		data, err := json.Marshal(names)
		require.NoError(t, err)
		s.apply(&Record{Seq: 1, Ev: evPlan, Data: data})
		s.apply(&Record{Seq: 2, Ev: evComplete, Stage: "b"})
		require.Equal(t, norm(lookUpEvery(s)), norm(viewOf(s)), "plan %q", names)
	}
}

// TestHandoffIndependentOfPlanSize renders the handoff of a plan of
// 100,000 stages and of 100 stages, each a quarter done: the big one may
// not take ten times as long (looking up every planned stage,
// it took about a thousand times as long).
func TestHandoffIndependentOfPlanSize(t *testing.T) {
	render := func(size int) time.Duration {
		s := newState()
		s.identity.ID = "plan-size"
		names := make([]string, size)
		for i := range names {
			names[i] = fmt.Sprintf("stage-%06d", i)
		}
		data, err := json.Marshal(names)
		require.NoError(t, err)
		s.apply(&Record{Seq: 1, Ev: evPlan, Data: data})
		for i := 0; i < size; i += 4 {
			s.apply(&Record{Seq: int64(i + 2), Ev: evComplete, Stage: names[i]})
		}
		require.Contains(t, s.nextSteps("DIR"), fmt.Sprintf("progress: %d of %d planned stages done", size/4, size))
		best := time.Duration(math.MaxInt64)
		for range 30 {
			start := time.Now()
			_ = s.nextSteps("DIR")
			best = min(best, time.Since(start))
		}
		return best
	}
	small, big := render(100), render(100_000)
	t.Logf("handoff of a 100-stage plan %v, of a 100,000-stage plan %v", small, big)
	assert.Less(t, big, 10*small, "the handoff's cost grows with the plan")
}

// runRecords is how many records the constant-time Open test generates:
// a million, as the budget says.
const runRecords = 1_000_000

// TestOpenConstantTime generates runs of 100,000 and 1,000,000 records with
// a manifest and opens each: Open reads the manifest and the last record,
// not the ledger (counted through the file-system seam), and takes about
// as long for either (budget: under 50 ms, independent of length).
//
// Under -race it uses 10,000 and 100,000: generating a million records
// took two of the package's ten minutes there on 2 busy cores, and the
// race build's times say nothing about the budget (500 ms there); the
// bytes read and the ratio prove the same at a tenth.
func TestOpenConstantTime(t *testing.T) {
	runRecords := runRecords
	if raceEnabled {
		runRecords /= 10
	}
	small, large := t.TempDir(), t.TempDir()
	start := time.Now()
	require.NoError(t, genRun(small, runRecords/10, true))
	require.NoError(t, genRun(large, runRecords, true))
	t.Logf("generated %d and %d records in %s", runRecords/10, runRecords, time.Since(start).Round(time.Millisecond))

	open := func(dir string) (time.Duration, int64, *Status) {
		c := newCountFS()
		t0 := time.Now()
		r := openCounted(t, dir, c, Options{Request: "generated run"})
		d := time.Since(t0)
		s, err := r.Status()
		require.NoError(t, err)
		require.NoError(t, r.Close())
		return d, c.ledgerRead.Load(), s
	}
	var ts, tl []time.Duration
	for i := 0; i < 5; i++ { // alternating, so that load on the machine hits both alike
		d, read, s := open(small)
		ts = append(ts, d)
		assert.Less(t, read, int64(64<<10), "Open of %d records read %d ledger bytes", runRecords/10, read)
		assert.Equal(t, int64(runRecords/10+2*i+1), s.Seq)
		d, read, s = open(large)
		tl = append(tl, d)
		assert.Less(t, read, int64(64<<10), "Open of %d records read %d ledger bytes", runRecords, read)
		assert.Equal(t, int64(runRecords+2*i+1), s.Seq)
		assert.GreaterOrEqual(t, len(s.Stages), genStages, "the snapshot's stages")
	}
	ms, ml := median(ts), median(tl)
	t.Logf("Open, median of 5: %d records %s, %d records %s (ratio %.2f; budget 50ms; fastest %s)",
		runRecords/10, ms, runRecords, ml, float64(ml)/float64(ms), slices.Min(tl))
	bound := 50 * time.Millisecond
	if raceEnabled {
		bound = 500 * time.Millisecond
	}
	// The budget is what Open costs, so the fastest of the five: other
	// processes on the machine only ever add to a time (the median of
	// five was 80 ms in a suite run while other builds held the 2 cores,
	// 18 ms alone).
	assert.Less(t, slices.Min(tl), bound, "Open of %d records", runRecords)
	// So is the growth, fastest against fastest: the medians' ratio was
	// 4.10 (74 and 302 ms) once in a suite run beside other sessions'
	// tests and fuzzing, the large run's fastest 56 ms.
	fs, fl := slices.Min(ts), slices.Min(tl)
	assert.Less(t, float64(fl), 3*float64(fs)+float64(5*time.Millisecond), "Open grows with ledger length (fastest of 5: %s, %s)", fs, fl)
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestOpenWithoutSnapshot damages manifest.json in every way it can be
// unusable: Open then replays the whole ledger (every byte read) and ends
// with the same state as from a good snapshot; Open rewrites the manifest,
// and the next Open uses it again.
func TestOpenWithoutSnapshot(t *testing.T) {
	const n = 20_000
	base := t.TempDir()
	require.NoError(t, genRun(base, n, true))
	good, err := os.ReadFile(filepath.Join(base, manifestFile))
	require.NoError(t, err)
	ledger, err := os.ReadFile(filepath.Join(base, filepath.FromSlash(ledgerFile)))
	require.NoError(t, err)

	// The state from the good snapshot, to compare with.
	c := newCountFS()
	r := openCounted(t, base, c, Options{Request: "generated run"})
	assert.Less(t, c.ledgerRead.Load(), int64(64<<10))
	want, err := r.Status()
	require.NoError(t, err)
	require.NoError(t, r.Close())

	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		require.NoError(t, json.Unmarshal(good, &m))
		f(m)
		data, err := json.Marshal(m)
		require.NoError(t, err)
		return data
	}
	for name, manifest := range map[string][]byte{
		"missing":         nil,
		"garbage":         []byte("{not json"),
		"other format":    edit(func(m map[string]any) { m["format"] = 2 }),
		"wrong hash":      edit(func(m map[string]any) { m["ledger"].(map[string]any)["hash"] = strings.Repeat("0", 64) }),
		"past the end":    edit(func(m map[string]any) { m["ledger"].(map[string]any)["end"] = len(ledger) + 100 }),
		"not on a record": edit(func(m map[string]any) { m["ledger"].(map[string]any)["offset"] = 7 }),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.FromSlash(ledgerFile)), ledger, 0o644))
			if manifest != nil {
				require.NoError(t, os.WriteFile(filepath.Join(dir, manifestFile), manifest, 0o644))
			}
			c := newCountFS()
			r := openCounted(t, dir, c, Options{Request: "generated run"})
			assert.GreaterOrEqual(t, c.ledgerRead.Load(), int64(len(ledger)), "a full replay reads every byte")
			got, err := r.Status()
			require.NoError(t, err)
			require.NoError(t, r.Close())
			assert.Equal(t, want.Stages, got.Stages)
			assert.Equal(t, want.Artifacts, got.Artifacts)
			assert.Equal(t, want.Plan, got.Plan)
			assert.Equal(t, want.Metrics.Sessions, got.Metrics.Sessions)
			assert.Equal(t, want.Seq, got.Seq)

			c = newCountFS()
			r = openCounted(t, dir, c, Options{Request: "generated run"})
			assert.Less(t, c.ledgerRead.Load(), int64(64<<10), "Open rewrote the manifest: the next one resumes from it")
			require.NoError(t, r.Close())
		})
	}
}

// TestMemoryIndependentOfLedgerLength replays runs of 10,000 and 100,000
// records without a snapshot: what stays in memory while the run is open
// is the state, which grows with stages, not with records.
func TestMemoryIndependentOfLedgerLength(t *testing.T) {
	heapOpen := func(n int) uint64 {
		dir := t.TempDir()
		require.NoError(t, genRun(dir, n, false))
		least := uint64(1 << 62)
		for i := 0; i < 3; i++ { // the least of three: other goroutines allocate too
			if err := os.Remove(filepath.Join(dir, manifestFile)); err != nil {
				require.ErrorIs(t, err, fs.ErrNotExist) // none before the first Open
			}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r, err := Open(dir, &Options{Request: "generated run"})
			require.NoError(t, err)
			runtime.GC()
			runtime.ReadMemStats(&after)
			require.NoError(t, r.Close())
			held := uint64(0)
			if after.HeapAlloc > before.HeapAlloc {
				held = after.HeapAlloc - before.HeapAlloc
			}
			least = min(least, held)
		}
		return least
	}
	small, large := heapOpen(10_000), heapOpen(100_000)
	t.Logf("heap held while open: %d records %d KiB, %d records %d KiB", 10_000, small>>10, 100_000, large>>10)
	assert.Less(t, large, small+1<<20, "ten times the records, about the same memory")
}

// While a complete waits for its fsync, another goroutine's Begin does not
// wait for that fsync: it is written by the side (sideWrite) while the
// leader holds the ledger lock, and it returns first. The complete's
// fsync is the one that makes both durable; the handoff shows both.
func TestBeginDoesNotWaitForAnFsync(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := newCountFS()
	r := openCounted(t, dir, c, Options{ManifestInterval: -1})
	st, err := r.Begin(ctx, "slow")
	require.NoError(t, err)
	c.inSync, c.hold = make(chan struct{}), make(chan struct{})
	completed := make(chan error, 1)
	go func() { completed <- st.Complete() }()
	<-c.inSync // the leader is in the complete's fsync, and stays there

	begun := make(chan error, 1)
	go func() {
		_, err := r.Begin(ctx, "quick")
		begun <- err
	}()
	select {
	case err := <-begun:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Begin waited for another goroutine's fsync")
	}
	select {
	case err := <-completed:
		t.Fatalf("Complete returned before its fsync ended: %v", err)
	default:
	}
	writes := c.ledgerWrites.Load()
	c.inSync = nil
	close(c.hold)
	require.NoError(t, <-completed)
	c.hold = nil
	assert.Equal(t, writes, c.ledgerWrites.Load(), "the begin was written during the fsync")

	seq, text := readHandoff(t, dir)
	recs := records(t, dir)
	last := recs[len(recs)-1]
	assert.Equal(t, "begin", last.Ev)
	assert.Equal(t, "quick", last.Stage)
	assert.Equal(t, last.Seq, seq, "the complete's handoff shows the begin written during its fsync")
	assert.Contains(t, text, "slow complete")
	require.NoError(t, r.Close())
	rep, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

// A begin written beside a running fsync that fails (a full disk) fails
// alone: the ledger is cut back, the complete whose fsync was running is
// acknowledged, and the begin can be tried again.
func TestSideWriteFailure(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := newCountFS()
	r := openCounted(t, dir, c, Options{})
	st, err := r.Begin(ctx, "slow")
	require.NoError(t, err)
	c.inSync, c.hold = make(chan struct{}), make(chan struct{})
	completed := make(chan error, 1)
	go func() { completed <- st.Complete() }()
	<-c.inSync

	c.failWrites.Store(1)
	begun := make(chan error, 1)
	go func() {
		_, err := r.Begin(ctx, "quick")
		begun <- err
	}()
	select {
	case err = <-begun:
	case <-time.After(10 * time.Second):
		t.Fatal("Begin waited for another goroutine's fsync")
	}
	var werr *WriteError
	require.ErrorAs(t, err, &werr, "the side-written begin fails")
	assert.ErrorIs(t, err, syscall.ENOSPC)
	assert.False(t, werr.Sticky)
	c.inSync = nil
	close(c.hold)
	require.NoError(t, <-completed, "the complete whose fsync ran is acknowledged")
	c.hold = nil

	_, err = r.Begin(ctx, "quick")
	require.NoError(t, err, "tried again")
	recs := records(t, dir)
	begins := 0
	for _, rec := range recs {
		if rec.Ev == "begin" && rec.Stage == "quick" {
			begins++
		}
	}
	assert.Equal(t, 1, begins, "the failed begin left nothing in the ledger")
	require.NoError(t, r.Close())
	rep, err := Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
}

// A Begin that records another session's attempt as interrupted, written
// beside a running fsync, returns only once the handoff shows it (after
// that fsync): only begin records alone may leave the handoff behind.
func TestSideWrittenInterruptedWaitsForHandoff(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := newCountFS()
	r := openCounted(t, dir, c, Options{})
	defer r.Close()
	dead, err := Open(dir, &Options{Request: "perf"})
	require.NoError(t, err)
	_, err = dead.Begin(ctx, "x")
	require.NoError(t, err)
	dead.crash() // x is left running by a dead session

	st, err := r.Begin(ctx, "slow")
	require.NoError(t, err)
	c.inSync, c.hold = make(chan struct{}), make(chan struct{})
	completed := make(chan error, 1)
	go func() { completed <- st.Complete() }()
	<-c.inSync // the leader sits in the complete's fsync
	writes := c.ledgerWrites.Load()

	begun := make(chan error, 1)
	go func() {
		_, err := r.Begin(ctx, "x")
		begun <- err
	}()
	require.Eventually(t, func() bool { return c.ledgerWrites.Load() > writes }, 10*time.Second, time.Millisecond,
		"the begin is written beside the fsync")
	select {
	case err := <-begun:
		c.inSync = nil
		close(c.hold) // let the leader and Close go on
		t.Fatalf("Begin returned (%v) before the handoff showed its interrupted record", err)
	case <-time.After(20 * time.Millisecond):
	}
	c.inSync = nil
	close(c.hold)
	require.NoError(t, <-begun)
	require.NoError(t, <-completed)
	c.hold = nil
	recs := records(t, dir)
	seq, _ := readHandoff(t, dir)
	assert.Equal(t, recs[len(recs)-1].Seq, seq, "the handoff is current when Begin returns")
	assert.Equal(t, []string{"interrupted", "begin"}, evs(recs[len(recs)-2:]))
}

// BenchmarkManifestEncode rewrites the manifest of a run of 10,000
// complete stages, each with an input and an output: as Run does
// (stages and artifacts written by hand), and, for the ratio, through
// encoding/json at once, as it was done before.
func BenchmarkManifestEncode(b *testing.B) {
	m := manifestOf("stage", "reason", "error", "artifacts/out.txt", "file:in.txt", strings.Repeat("ab", 32), "k", nil, 10_000, 1700000000)
	hint := 0 // a Run passes the length of the manifest it wrote before
	byHand := func(m *manifest) ([]byte, error) {
		data, err := m.encode(hint)
		hint = len(data)
		return data, err
	}
	for _, c := range []struct {
		name   string
		encode func(*manifest) ([]byte, error)
	}{{"by-hand", byHand}, {"encoding-json", encodeWhole}} {
		b.Run(c.name, func(b *testing.B) {
			data, err := c.encode(m)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := c.encode(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
