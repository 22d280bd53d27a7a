package runstate

import (
	"bufio"
	"errors"
	"io"
	"os"
	"runtime"
)

// errLineTooLong is returned by a lineSource for a line longer than
// maxLine that ends in '\n'; replay turns it into a *CorruptError.
var errLineTooLong = errors.New("runstate: ledger line too long")

// errTornTooLong is returned by a lineSource at the end of its input when
// what follows the last '\n' is longer than maxLine: a torn tail like a
// shorter one (a writer died mid-append), which replay does not apply.
var errTornTooLong = errors.New("runstate: ledger ends in a torn line longer than the limit")

// lineSource yields the lines of a ledger for replay, each with its facts
// (its chain hash, whether its checksum matches, whether it is plain), so
// that hashing and checksumming can run ahead of decoding on another core.
type lineSource interface {
	// next returns the next line with its '\n' and the facts of the line
	// without it (factsOf). At the end it returns what follows the last
	// '\n' (maybe nothing), no facts and io.EOF; when that is longer
	// than maxLine, no line and errTornTooLong; on a failed read or a
	// line longer than maxLine that ends in '\n', an error. The line is
	// valid until the next call.
	next() (line []byte, facts lineFacts, err error)
	// stop ends the source; the reader is not read after stop returns.
	stop()
}

// asyncLinesOK lets replay hash on a goroutine of its own (tests turn it
// off to compare both ways).
var asyncLinesOK = true

// asyncMin is the ledger size from which replay hashes on a goroutine of
// its own: below it, starting one costs more than it saves.
const asyncMin = 1 << 20

// newLineSource returns a source for r: synchronous for a short section
// (Open's tail, catchUp) or a single CPU, with a hashing goroutine for a
// whole ledger.
func newLineSource(r io.Reader) lineSource {
	size := 256 << 10
	async := asyncLinesOK && runtime.GOMAXPROCS(0) > 1
	switch r := r.(type) {
	case *io.SectionReader:
		if r.Size() < int64(size) {
			size = int(r.Size()) + 1
		}
		async = async && r.Size() >= asyncMin
	case *os.File:
	case interface{ Len() int }: // bytes.Reader, strings.Reader
		if r.Len() < size {
			size = r.Len() + 1
		}
		async = false
	default:
		async = false
	}
	src := &syncLines{br: bufio.NewReaderSize(r, size)}
	if !async {
		return src
	}
	a := &asyncLines{
		ch:    make(chan *lineBatch, 2),
		free:  make(chan *lineBatch, 3),
		quit:  make(chan struct{}),
		ended: make(chan struct{}),
	}
	go a.run(src)
	return a
}

// syncLines reads and hashes lines in the caller's goroutine.
type syncLines struct {
	br   *bufio.Reader
	long []byte // a line longer than the buffer, gathered here
	over bool   // the line is longer than maxLine: skipped, not gathered
}

func (s *syncLines) next() ([]byte, lineFacts, error) {
	for {
		line, err := s.br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if !s.over {
				s.long = append(s.long, line...)
			}
			if len(s.long) > maxLine {
				// Read on to its end, without keeping it: only a '\n'
				// tells a line too long from a torn tail.
				s.long, s.over = nil, true
			}
			continue
		}
		over := s.over || len(s.long)+len(line) > maxLine // the '\n' counts, as for the writer
		s.over = false
		if s.long != nil {
			line = append(s.long, line...)
			s.long = nil
		}
		switch {
		case err == nil && over:
			return nil, lineFacts{}, errLineTooLong
		case err == io.EOF && over:
			return nil, lineFacts{}, errTornTooLong
		case err != nil:
			return line, lineFacts{}, err
		}
		return line, factsOf(line[:len(line)-1]), nil
	}
}

func (s *syncLines) stop() {}

// lineBatch is a run of lines read and hashed ahead of the caller.
type lineBatch struct {
	buf   []byte      // the lines, one after the other
	ends  []int       // where each line ends in buf
	facts []lineFacts // each line's
	err   error       // returned with the last line
}

// asyncLines reads and hashes lines on a goroutine of its own, a few
// batches ahead of the caller.
type asyncLines struct {
	ch    chan *lineBatch // full batches, in order
	free  chan *lineBatch // batches to reuse
	quit  chan struct{}   // closed by stop
	ended chan struct{}   // closed when run returns
	cur   *lineBatch
	k     int // next line in cur
}

func (a *asyncLines) run(src *syncLines) {
	defer close(a.ended)
	for {
		var b *lineBatch
		select {
		case b = <-a.free:
			b.buf, b.ends, b.facts = b.buf[:0], b.ends[:0], b.facts[:0]
		default:
			b = &lineBatch{buf: make([]byte, 0, 256<<10)}
		}
		for len(b.ends) < 1024 && len(b.buf) < 256<<10 {
			line, facts, err := src.next()
			b.buf = append(b.buf, line...)
			b.ends = append(b.ends, len(b.buf))
			b.facts = append(b.facts, facts)
			if err != nil {
				b.err = err
				break
			}
		}
		select {
		case a.ch <- b:
		case <-a.quit:
			return
		}
		if b.err != nil {
			return
		}
	}
}

func (a *asyncLines) next() ([]byte, lineFacts, error) {
	if a.cur == nil || a.k == len(a.cur.ends) {
		if a.cur != nil {
			select {
			case a.free <- a.cur:
			default:
			}
		}
		a.cur, a.k = <-a.ch, 0 // run sends until a batch ends with an error
	}
	b := a.cur
	start := 0
	if a.k > 0 {
		start = b.ends[a.k-1]
	}
	line, facts := b.buf[start:b.ends[a.k]], b.facts[a.k]
	a.k++
	if a.k == len(b.ends) && b.err != nil {
		return line, facts, b.err
	}
	return line, facts, nil
}

func (a *asyncLines) stop() {
	close(a.quit)
	<-a.ended
}
