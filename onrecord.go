package runstate

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// notifier hands this session's records to Options.OnRecord: in ledger
// order, once they are durable (the records a Begin writes: once written),
// and outside the ledger lock. The committer adds each record it writes to
// pending (under Run.stMu, so in ledger order: side writers hold it too);
// at the end of the batch, after its fsync, apply moves them to ready; the
// leader hands ready ones to fn once it stops leading, holding calling, so
// that two goroutines never call fn at once or out of order. A batch that
// did not land (a failed write or fsync) drops its records.
type notifier struct {
	fn      func(Record) // nil: no notifier, and nothing here costs anything
	pending []Record     // written, not yet durable; guarded by Run.stMu

	mu    sync.Mutex
	ready []Record

	calling sync.Mutex // held while fn runs
}

// written notes a record just encoded into the batch. The caller holds
// Run.stMu.
func (n *notifier) written(rec *Record) {
	if n.fn == nil {
		return
	}
	c := *rec
	c.Inputs = maps.Clone(rec.Inputs)
	c.Outputs = slices.Clone(rec.Outputs)
	c.Data = slices.Clone(rec.Data)
	n.pending = append(n.pending, c)
}

// mark is where the batch being written starts in pending; cut drops what
// follows it (the write failed: those records are not in the ledger).
func (n *notifier) mark() int    { return len(n.pending) }
func (n *notifier) cut(mark int) { n.pending = n.pending[:mark] }

// durable makes the pending records ready for fn: the batch is durable
// (or, without an fsync, written). The caller holds Run.stMu.
func (n *notifier) durable() {
	if len(n.pending) == 0 {
		return
	}
	n.mu.Lock()
	n.ready = append(n.ready, n.pending...)
	n.mu.Unlock()
	clear(n.pending)
	n.pending = n.pending[:0]
}

// lost drops the pending records: their fsync failed, so they are not
// acknowledged, and the run is read-only.
func (n *notifier) lost() {
	clear(n.pending)
	n.pending = n.pending[:0]
}

// deliver calls fn with the ready records, in order. It holds no lock of
// the Run's but its own while fn runs. A goroutine that finds another
// delivering leaves its records to it: the other looks again after it let
// go, so no record waits for the next commit.
func (n *notifier) deliver() {
	if n.fn == nil {
		return
	}
	for {
		if !n.calling.TryLock() {
			return
		}
		n.mu.Lock()
		recs := n.ready
		n.ready = nil
		n.mu.Unlock()
		func() {
			defer n.calling.Unlock() // fn may panic
			for i := range recs {
				n.fn(recs[i])
			}
		}()
		n.mu.Lock()
		more := len(n.ready) > 0
		n.mu.Unlock()
		if !more {
			return
		}
	}
}

// noticeDone tells fn that Begin found stage done and its evidence
// holding: no record is written for that (the close record counts such
// stages), but a progress display wants to say "skip". The notice is a
// Record with Seq 0 and Ev "skip" (see Options.OnRecord).
func (r *Run) noticeDone(stage string, attempt int, reason string) {
	n := &r.notes
	if n.fn == nil {
		return
	}
	n.mu.Lock()
	n.ready = append(n.ready, Record{At: time.Now().UTC(), Ev: evSkip, Session: r.session, Stage: stage, Attempt: attempt, Reason: reason})
	n.mu.Unlock()
	n.deliver()
}
