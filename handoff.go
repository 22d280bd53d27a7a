package runstate

import (
	"sync"
	"sync/atomic"
	"time"
)

// The projections a batch publishes through its Store (Batch.Publish): the
// handoff (logs/next-steps.txt, rendered by nextsteps.go) and the snapshot
// (manifest.json, manifest.go). Both are best effort: a reader or the next
// Open rebuilds them from the records.

// handoffLag is how long, at most, logs/next-steps.txt may lag the ledger
// by begin records. A batch of begins alone does not republish the
// handoff: the stage's complete (or fail, skip, await) comes soon and
// republishes it, which halves the handoff rewrites of a short stage. A
// stage that runs longer than this shows as running: a timer republishes
// the handoff then. Every other record is in the handoff when the call
// that appended it returns, but in a store that paces its projections
// (Pacer): the timer then asks it again every handoffLag until it would
// write one.
const handoffLag = 50 * time.Millisecond

// handoffTimer keeps the handoff's lag behind begin records. behind: the
// handoff lags the records by begins; flushes counts the handoffs the lag
// timer republished (tests); timer, when set, republishes it; flushing
// counts the timer's runs; closing: no new timer. Guarded by the
// committer's mu, but behind, which the leader uses under stMu.
type handoffTimer struct {
	behind   bool
	flushes  atomic.Int64
	timer    stopper // on the batch policy's clock
	flushing sync.WaitGroup
	closing  bool
}

// writeNextSteps publishes logs/next-steps.txt. The caller holds the
// run's lock, so the newest one wins, and stMu.
func (r *Run) writeNextSteps(b Batch) {
	r.c.lag.behind = false
	b.Publish(r.st.position(), nil, []byte(r.st.nextStepsIn(r.where)))
}

// dues is what the store would write if a batch published it now
// (Pacer.PublishDue), asked at most once a batch (due), and only when the
// batch has a projection to render.
type dues struct{ asked, manifest, handoff bool }

// due asks the store what it would write now, once: a store that is no
// Pacer writes everything it is given.
func (r *Run) due(d *dues) *dues {
	if !d.asked {
		d.asked, d.manifest, d.handoff = true, true, true
		if r.pacer != nil {
			d.manifest, d.handoff = r.pacer.PublishDue()
		}
	}
	return d
}

// publishHandoff publishes the handoff when the store would write it now
// (due), and reports whether it did; otherwise the handoff lags, and the
// handoff timer asks again handoffLag from now. The caller holds the
// run's lock and stMu.
func (r *Run) publishHandoff(b Batch, d *dues) bool {
	if r.due(d).handoff {
		r.writeNextSteps(b)
		return true
	}
	r.c.lag.behind = true
	r.flushHandoffLater()
	return false
}

// flushHandoffLater arms the timer that republishes the handoff when it
// still lags by begin records handoffLag from now.
func (r *Run) flushHandoffLater() {
	c := &r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.lag.closing || c.lag.timer != nil {
		return
	}
	c.lag.flushing.Add(1)
	c.lag.timer = c.policy.clock.AfterFunc(handoffLag, func() {
		defer c.lag.flushing.Done()
		c.mu.Lock()
		c.lag.timer = nil
		stop := c.closed || c.lag.closing
		c.mu.Unlock()
		if !stop {
			_, _ = r.commitTx(&tx{fn: func(*state) ([]*Record, error) { return nil, nil }, flush: true})
		}
	})
}

// stopFlush disarms the handoff timer for good and, with wait, waits for
// a flush already under way.
func (r *Run) stopFlush(wait bool) {
	c := &r.c
	c.mu.Lock()
	c.lag.closing = true
	t := c.lag.timer
	c.lag.timer = nil
	c.mu.Unlock()
	if t != nil && t.Stop() {
		c.lag.flushing.Done()
	}
	if wait {
		c.lag.flushing.Wait()
	}
}

// writeManifest publishes manifest.json, the snapshot the next Open
// resumes from. The caller holds the run's lock and stMu.
func (r *Run) writeManifest(b Batch) {
	start := time.Now()
	data, err := r.st.encodeManifest(start)
	if err != nil {
		r.log.Warn("runstate: cannot encode the manifest; the next Open rebuilds it", "store", r.store.String(), "err", err)
		return
	}
	b.Publish(r.st.position(), data, nil)
	r.c.mu.Lock()
	r.c.manifest = time.Now()
	r.c.manifestCost = r.c.manifest.Sub(start)
	r.c.mu.Unlock()
}

func (r *Run) manifestAt() time.Time {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.manifest
}

// manifestInterval is how long a running session waits between two
// manifest rewrites: Options.ManifestInterval, or longer when a rewrite is
// slow (it is O(stages) and holds the run's lock), so that rewriting the
// snapshot never takes more than about 2% of the time. A resume replays at
// most what was appended since, at a million records a second.
func (r *Run) manifestInterval() time.Duration {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return max(r.opts.ManifestInterval, 50*r.c.manifestCost)
}
