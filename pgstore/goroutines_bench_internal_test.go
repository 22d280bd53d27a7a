package pgstore

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/cpustat"
)

// goroutineRound is the checkpoints of one round of BenchmarkGoroutines in
// each mode, and goroutines the goroutines of its concurrent mode.
const (
	goroutineRound = 400
	goroutines     = 8
)

// BenchmarkGoroutines is a checkpoint (Do with one small output, each a new
// stage) per op, from 8 goroutines on one run, against the same from one
// goroutine on another run (off the clock), in alternating rounds of 400
// (which mode goes first alternates too). Each session has its run alone,
// so its begins are sent ahead of their reply (ahead.go). It reports the
// median over rounds of each mode's throughput and of their ratio
// (8g/seq: the target is 3), and where the 8 goroutines' time
// goes between the awaited batches (the completes) on the pipeline:
// awaited-µs, from an awaited batch's write to its reply (the server's
// work on it and on the begins before it, its WAL flush, the wake-ups),
// and gap-µs, from that reply to the next awaited batch's write (the
// client's: the released goroutines' begins, their work, their
// completes); completes/batch and begins/batch are the records an awaited
// batch and a batch sent ahead carried (medians over every batch);
// seq-awaited-µs is awaited-µs of the sequential rounds, one complete a
// batch (the rest of a sequential checkpoint's time is the client's). On
// Linux with the server on this machine, busy-% is the share of the
// machine's CPUs that the server's processes and this one used in the
// 8-goroutine rounds (seq-busy-%: in the sequential ones), server-µs/op
// and client-µs/op their CPU a checkpoint there, and ceiling the most
// 8g/seq could be at that CPU a checkpoint with every CPU busy (the CPUs
// × the sequential checkpoint's time ÷ the CPU of a concurrent one):
//
//	cd pgstore && ./testdb.sh go test -run '^$' -bench Goroutines -benchtime 4000x .
func BenchmarkGoroutines(b *testing.B) {
	db := newTestDB(b)
	open := func(name string) (*runstate.Run, *store) {
		// The pipeline is used once the session has the run alone and a
		// batch sent after that was confirmed (ahead.go).
		st, r := openAlone(b, db, name)
		for i := range 20 {
			doStage(b, r, fmt.Sprintf("warm-%d", i))
		}
		return r, st
	}
	seqRun, seqSt := open("seq")
	parRun, parSt := open("par")
	var events, seqEvents []pipeEvent
	for _, t := range []struct {
		st *store
		to *[]pipeEvent
	}{{seqSt, &seqEvents}, {parSt, &events}} {
		t.st.ahead.mu.Lock()
		t.st.ahead.trace = func(e pipeEvent) { *t.to = append(*t.to, e) } // under a.mu
		t.st.ahead.mu.Unlock()
	}

	k := 0
	round := func(r *runstate.Run, g, n int) time.Duration {
		k++
		start := time.Now()
		var wg sync.WaitGroup
		for j := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n / g {
					doStage(b, r, fmt.Sprintf("r%d-g%d-%d", k, j, i))
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	var seqRate, parRate, ratio []float64
	var awaited, gap, seqAwaited []time.Duration
	var completes, begins []int
	var seqCPU, parCPU cpustat.Span
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(goroutineRound, b.N-done)
		n -= n % goroutines
		if n == 0 {
			n = goroutines
		}
		var seqTime, parTime time.Duration
		for _, par := range []bool{k%4 == 0, k%4 != 0} {
			if !par {
				b.StopTimer()
				seqSt.ahead.mu.Lock()
				seqEvents = seqEvents[:0]
				seqSt.ahead.mu.Unlock()
				start := cpustat.Now()
				seqTime = round(seqRun, 1, n)
				seqCPU.Add(start, seqTime, n)
				seqSt.ahead.mu.Lock()
				a, _, _, _ := pipeCycle(seqEvents)
				seqSt.ahead.mu.Unlock()
				seqAwaited = append(seqAwaited, a...)
				b.StartTimer()
				continue
			}
			parSt.ahead.mu.Lock()
			events = events[:0]
			parSt.ahead.mu.Unlock()
			start := cpustat.Now()
			parTime = round(parRun, goroutines, n)
			parCPU.Add(start, parTime, n)
			parSt.ahead.mu.Lock()
			a, g, c, l := pipeCycle(events)
			parSt.ahead.mu.Unlock()
			awaited, gap = append(awaited, a...), append(gap, g...)
			completes, begins = append(completes, c...), append(begins, l...)
		}
		done += n
		seq, par := float64(n)/seqTime.Seconds(), float64(n)/parTime.Seconds()
		seqRate, parRate, ratio = append(seqRate, seq), append(parRate, par), append(ratio, par/seq)
	}
	b.StopTimer()
	b.ReportMetric(median(seqRate), "seq-ops/s")
	b.ReportMetric(median(parRate), "8g-ops/s")
	b.ReportMetric(median(ratio), "8g/seq")
	if len(awaited) > 0 {
		b.ReportMetric(float64(median(awaited).Microseconds()), "awaited-µs")
		b.ReportMetric(float64(median(completes)), "completes/batch")
	}
	if len(seqAwaited) > 0 {
		b.ReportMetric(float64(median(seqAwaited).Microseconds()), "seq-awaited-µs")
	}
	if len(gap) > 0 {
		b.ReportMetric(float64(median(gap).Microseconds()), "gap-µs")
	}
	if len(begins) > 0 {
		b.ReportMetric(float64(median(begins)), "begins/batch")
	}
	if seqCPU.OK() && parCPU.OK() {
		cpus := runtime.NumCPU()
		server, client := parCPU.PerOp()
		b.ReportMetric(parCPU.Busy(cpus), "busy-%")
		b.ReportMetric(seqCPU.Busy(cpus), "seq-busy-%")
		b.ReportMetric(float64(server.Microseconds()), "server-µs/op")
		b.ReportMetric(float64(client.Microseconds()), "client-µs/op")
		b.ReportMetric(cpustat.Ceiling(seqCPU, parCPU, cpus), "ceiling")
	}
}

// doStage runs one checkpoint (doOutput) and fails b on its error.
func doStage(b *testing.B, r *runstate.Run, name string) {
	if err := doOutput(context.Background(), r, name); err != nil {
		b.Error(err)
	}
}

// pipeCycle splits a trace of the pipeline (ahead.trace) into the awaited
// batches' times from write to reply, the gaps from a reply to the next
// awaited batch's write, and the records of each awaited batch and of each
// batch sent ahead.
func pipeCycle(events []pipeEvent) (awaited, gap []time.Duration, completes, begins []int) {
	var sent, replied time.Time
	for _, e := range events {
		switch {
		case e.lazy:
			begins = append(begins, e.records)
		case !e.replied:
			sent = e.at
			completes = append(completes, e.records)
			if !replied.IsZero() {
				gap = append(gap, e.at.Sub(replied))
			}
		case !sent.IsZero():
			awaited = append(awaited, e.at.Sub(sent))
			replied = e.at
		}
	}
	return awaited, gap, completes, begins
}
