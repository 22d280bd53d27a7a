package cpustat

import (
	"testing"
	"time"
)

func TestSpanFigures(t *testing.T) {
	// Sequential: 1000 ops in 500 ms of wall time (500 µs each).
	seq := Span{Server: 300 * time.Millisecond, Client: 200 * time.Millisecond, Wall: 500 * time.Millisecond, Ops: 1000}
	// Concurrent: 1000 ops, 250 µs of CPU each, in 200 ms on 2 CPUs.
	conc := Span{Server: 150 * time.Millisecond, Client: 100 * time.Millisecond, Wall: 200 * time.Millisecond, Ops: 1000}
	if s, c := conc.PerOp(); s != 150*time.Microsecond || c != 100*time.Microsecond {
		t.Errorf("PerOp = %v, %v; want 150µs, 100µs", s, c)
	}
	if got := conc.Busy(2); got != 62.5 {
		t.Errorf("Busy(2) = %v; want 62.5", got)
	}
	// 2 CPUs × 500 µs ÷ 250 µs.
	if got := Ceiling(seq, conc, 2); got != 4 {
		t.Errorf("Ceiling = %v; want 4", got)
	}
	if !seq.OK() {
		t.Error("a span of rounds that measured the server is not OK")
	}
	var s Span
	if s.OK() {
		t.Error("an empty span is OK")
	}
	short := seq
	short.Wall = minWall - time.Millisecond
	if short.OK() {
		t.Errorf("a span of %v, under a few ticks, is OK", short.Wall)
	}
	// This process's CPU runs from start's reading of the server's to
	// end's: the 8 ms each reading took is left out.
	var r Span
	r.add(Sample{Client: 10 * time.Millisecond, after: 18 * time.Millisecond, ok: true},
		Sample{Client: 30 * time.Millisecond, after: 38 * time.Millisecond, ok: true}, time.Second, 1)
	if r.Client != 12*time.Millisecond {
		t.Errorf("Client = %v; want 12ms, without the readings of /proc", r.Client)
	}
	s.Add(Sample{}, time.Millisecond, 1) // a start without the server's CPU
	if s.OK() {
		t.Error("a span with a round that did not measure the server is OK")
	}
}
