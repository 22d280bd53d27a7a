package runstate

import (
	"runtime"
	"slices"
	"sync/atomic"
	"time"
)

// batchPolicy decides, for the committer (commit.go), when a leader yields
// before taking a batch and when it holds the batch a little for more
// transactions (cooperate, gather). It keeps the moving averages those
// choices rest on, measured on its clock, which also runs gather's wait
// and the handoff's lag timer (handoff.go); tests inject one they drive by
// hand. Its fields are guarded by the committer's mu, but gathered and
// gatherLate, which tests read, and clock, which is set before the Run's
// first batch and not changed after (but by a test, under mu).
type batchPolicy struct {
	clock clock
	// woke: the last batch woke a goroutine other than its leader.
	woke bool
	// arrive, when set, is closed as a transaction to sync is queued;
	// gatherOff counts the batches gather still skips, and gatherMiss
	// the waits in a row that ran out; syncTime is how long making a
	// batch durable takes here, stageTime how long this process's stage
	// attempts run, begin to end (moving averages); gathered counts the
	// waits that ended with every record expected, gatherLate those that
	// ran out (for tests).
	arrive     chan struct{}
	gatherOff  int
	gatherMiss int
	syncTime   time.Duration
	stageTime  time.Duration
	gathered   atomic.Int64
	gatherLate atomic.Int64
	// yieldTime: how long cooperate's yield takes (a moving average of
	// the smaller of each two yields in a row); lastYield: the last
	// yield's time; coopSkipped counts the batches it skipped.
	yieldTime   time.Duration
	lastYield   time.Duration
	coopSkipped int
}

// batchRunner is what the policy needs of the committer besides its queue:
// writing a batch at once when no other session holds the run's lock
// (false: one does; nothing was written).
type batchRunner interface {
	runNow(batch []*tx) bool
}

// clock is the batch policy's time and its timers: the wall clock
// (wallClock), or a test's that it advances by hand.
type clock interface {
	Now() time.Time
	// NewTimer returns a channel that receives once d has passed, and the
	// timer, to stop when it is no longer waited for.
	NewTimer(d time.Duration) (<-chan time.Time, stopper)
	// AfterFunc calls f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) stopper
}

// stopper is a timer of a clock; Stop reports whether it stopped the timer
// before it fired (as time.Timer's Stop).
type stopper interface{ Stop() bool }

// wallClock is the clock of the time package.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) NewTimer(d time.Duration) (<-chan time.Time, stopper) {
	t := time.NewTimer(d)
	return t.C, t
}

func (wallClock) AfterFunc(d time.Duration, f func()) stopper { return time.AfterFunc(d, f) }

func (p *batchPolicy) init() { p.clock = wallClock{} }

func (p *batchPolicy) now() time.Time { return p.clock.Now() }

func (p *batchPolicy) since(t time.Time) time.Duration { return p.now().Sub(t) }

// noteStage notes how long a stage attempt ran, begin to end.
func (p *batchPolicy) noteStage(d time.Duration) {
	if p.stageTime == 0 {
		p.stageTime = d
	} else {
		p.stageTime += (d - p.stageTime) / 8
	}
}

// noteSync notes how long making a batch durable took.
func (p *batchPolicy) noteSync(d time.Duration) {
	if p.syncTime == 0 {
		p.syncTime = d
	} else {
		p.syncTime += (d - p.syncTime) / 8
	}
}

// arrived wakes a gathering leader: a transaction to sync is queued.
func (p *batchPolicy) arrived() {
	if p.arrive != nil {
		close(p.arrive)
		p.arrive = nil
	}
}

// cooperate is the policy's cooperate for r's committer.
func (r *Run) cooperate(own *tx) { r.c.policy.cooperate(&r.c, r, own) }

// gatherBatch is the policy's gather for r's committer.
func (r *Run) gatherBatch(own *tx) { r.c.policy.gather(&r.c, r, own) }

// runNow writes batch if the run's lock can be taken at once.
func (r *Run) runNow(batch []*tx) bool {
	b, locked, err := r.tryLock()
	if err != nil || !locked {
		return false
	}
	_ = r.runLocked(batch, b, nil)
	return true
}

// cooperate yields once and lets gather gather the next batch (see
// commitTx), unless the processors are busy with other work. A yield
// normally takes some microseconds (the woken goroutines run up to their
// next commit); where the program's own goroutines hold every P it waits
// for a time slice to come round, milliseconds, and so does every wake-up
// of the leader after it: then yielding and gathering cost more than the
// fsyncs they save. So while a yield takes longer than coopBusy (on
// average: yieldTime), it only yields once in coopProbe batches, to see
// whether that has changed. The average takes the smaller of each two
// yields in a row: a lone slow yield is the machine's other processes
// (the kernel ran one while the leader was in its yield: it would have
// run it anyway), not the program's goroutines, whose time slices make
// yields slow again and again. Taken alone, one such yield early in a
// run made it busy for hundreds of batches, since a busy run measures
// only one yield in coopProbe. The caller is the leader and holds c.mu.
func (p *batchPolicy) cooperate(c *committer, run batchRunner, own *tx) {
	busy := func() bool { return p.yieldTime > coopBusy }
	if busy() {
		p.coopSkipped++
		if p.coopSkipped%coopProbe != 0 {
			return
		}
	}
	start := p.now()
	c.mu.Unlock()
	gosched()
	c.mu.Lock()
	d := p.since(start)
	p.yieldTime += (min(d, p.lastYield) - p.yieldTime) / 4
	p.lastYield = d
	if !busy() {
		p.gather(c, run, own)
	}
}

// gosched is cooperate's yield; a test makes it slow.
var gosched = runtime.Gosched

// coopBusy: a yield that takes longer than this, on average, waited for
// a time slice (the Go scheduler's is 10 ms); a yield with processors to
// spare takes some microseconds (26 µs a batch with 8 goroutines on 2
// CPUs here). coopProbe: while yields are that slow, cooperate yields in
// one batch of this many.
const (
	coopBusy  = time.Millisecond
	coopProbe = 64
)

// gather runs before a batch when the last one woke other goroutines
// and they have had their turn (the leader's yield). Most of them come
// back at once with the begin of their next stage, and a little later
// with its complete. Taken together with the completes already queued,
// those begins would be released before the fsync and their completes
// would miss it: the goroutines would fall into two groups taking turns,
// each batch holding half of them and each Do spanning two fsyncs. So
// when the queue holds both, gatherBatch writes the begins alone (no
// fsync: their goroutines go on at once) and waits, at most one and a
// half times as long as an fsync takes here (gatherWait), until as many
// more completes (or other records to sync) are queued, so that one fsync
// covers both groups. Where stages
// take longer than an fsync (on average: stageTime), it does not wait:
// nothing to gain. A wait that runs out anyway turns gathering off for a
// number of batches that doubles while waits keep running out
// (gatherMaxMiss). The caller is the leader, whose own transaction is
// own, and holds c.mu, which gather releases while it writes and
// waits.
func (p *batchPolicy) gather(c *committer, run batchRunner, own *tx) {
	if p.gatherOff > 0 {
		p.gatherOff--
		return
	}
	if p.syncTime <= 0 || p.stageTime <= 0 || p.stageTime >= p.syncTime {
		// No fsync measured yet, or none made (NoSync); or stages take
		// longer than an fsync here, and their goroutines would not be
		// back in time.
		return
	}
	var begins, rest []*tx
	for _, q := range c.queue {
		if q.lazy {
			begins = append(begins, q)
		} else {
			rest = append(rest, q)
		}
	}
	if len(begins) == 0 || !slices.ContainsFunc(rest, func(q *tx) bool { return q.sync }) {
		return
	}
	c.queue = rest
	c.mu.Unlock()
	if !run.runNow(begins) {
		// Another session holds the run's lock: lead waits for it.
		c.mu.Lock()
		c.queue = append(begins, c.queue...)
		return
	}
	c.mu.Lock()
	want := len(begins)
	if slices.Contains(begins, own) {
		want-- // the leader's own stage runs only once it stops leading
	}
	for _, q := range rest {
		if q.sync {
			want++
		}
	}
	deadline := p.now().Add(p.syncTime * gatherWait / 2)
	for {
		n := 0
		for _, q := range c.queue {
			if q.sync {
				n++
			}
		}
		if c.closed {
			return
		}
		if n >= want {
			p.gathered.Add(1)
			p.gatherMiss = 0
			return
		}
		left := deadline.Sub(p.now())
		if left <= 0 {
			p.gatherMiss = min(p.gatherMiss+1, gatherMaxMiss)
			p.gatherOff = 1 << (p.gatherMiss + 2)
			p.gatherLate.Add(1)
			return
		}
		arrive := make(chan struct{})
		p.arrive = arrive
		c.mu.Unlock()
		fired, t := p.clock.NewTimer(left)
		select {
		case <-arrive:
		case <-fired:
		}
		t.Stop()
		c.mu.Lock()
		p.arrive = nil
	}
}

// gatherWait: gatherBatch waits at most gatherWait/2 times the fsync's
// moving average. The woken goroutines' output files are created one at a
// time by the kernel, and 6-8 of them take about as long as an fsync
// here: with a wait of one fsync, 5% of the waits ran out (each turning
// gathering off for 8 batches or more); one and a half made 3-8% more
// checkpoints per second with 8 goroutines in five sets of runs on this
// machine's disk, and no difference with a journal (PERF.md).
const gatherWait = 3

// After a wait that ran out, gatherBatch skips the next 8 batches; after
// k in a row, 4<<k, up to 512 (gatherMaxMiss): a goroutine that came back
// late once (it was not scheduled, it ended its work) costs little,
// stages that take longer than an fsync cost one wait in 512 batches.
const gatherMaxMiss = 7
