package cpustat

import "time"

// Sample is the CPU time used so far by the server's processes (ok: some
// were found on this machine) and by this process: Client before it read
// the server's, after once it had (reading /proc takes this process 2 to
// 3 ms of CPU with 74 processes here, which a Span leaves out).
type Sample struct {
	Server, Client time.Duration
	after          time.Duration
	ok             bool
}

// Now takes a Sample.
func Now() Sample {
	client := Self()
	server, ok := Postgres()
	return Sample{Server: server, Client: client, after: Self(), ok: ok}
}

// Span adds up the CPU, the wall time and the operations of measured
// rounds. It is not safe for concurrent use.
type Span struct {
	Server, Client, Wall time.Duration
	Ops                  int
	broken               bool // a round without the server's CPU
}

// Add adds a round of ops operations that took wall and started at
// start; it takes the round's end Sample itself. This process's CPU is
// counted from start's reading of the server's to end's, so the span
// leaves out what reading them cost.
func (s *Span) Add(start Sample, wall time.Duration, ops int) { s.add(start, Now(), wall, ops) }

func (s *Span) add(start, end Sample, wall time.Duration, ops int) {
	s.broken = s.broken || !start.ok || !end.ok
	s.Server += end.Server - start.Server
	s.Client += end.Client - start.after
	s.Wall += wall
	s.Ops += ops
}

// OK reports whether the span's figures mean something: it has rounds,
// the server's CPU was measured in every one, and they took at least
// minWall (the server's times come in ticks of 10 ms).
func (s Span) OK() bool { return !s.broken && s.Ops > 0 && s.Wall >= minWall && s.Server+s.Client > 0 }

// minWall is the least wall time of a Span whose figures are reported:
// 20 ticks of /proc/PID/stat.
const minWall = 20 * time.Second / clockTicks

// PerOp is the server's and this process's CPU an operation.
func (s Span) PerOp() (server, client time.Duration) {
	return s.Server / time.Duration(s.Ops), s.Client / time.Duration(s.Ops)
}

// Busy is the share of cpus (in percent) the server and this process used.
func (s Span) Busy(cpus int) float64 {
	return 100 * float64(s.Server+s.Client) / float64(s.Wall) / float64(cpus)
}

// Ceiling is the most conc's throughput could be, as a multiple of seq's,
// with every one of cpus busy at conc's CPU an operation: cpus × seq's
// wall time an operation ÷ conc's CPU an operation.
func Ceiling(seq, conc Span, cpus int) float64 {
	perSeq := float64(seq.Wall) / float64(seq.Ops)
	perConc := float64(conc.Server+conc.Client) / float64(conc.Ops)
	return float64(cpus) * perSeq / perConc
}
