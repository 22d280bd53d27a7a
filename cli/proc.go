package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"time"
)

// proc is a command for runProc to run.
type proc struct {
	argv           []string
	env            []string
	stdin          io.Reader // nil: no input
	stdout, stderr io.Writer // nil: discarded
}

// procResult is how a command ended.
type procResult struct {
	started   bool
	code      int       // exit status; 128+N when killed by signal N
	signal    os.Signal // the signal that killed it, if one did
	forwarded os.Signal // a signal that runProc passed on to it, if any
	err       error     // it could not start, or its output could not be kept
}

// how says how the command ended, for a message.
func (r procResult) how() string {
	if r.signal != nil {
		return fmt.Sprintf("was killed by signal %d (%v)", r.signal, r.signal)
	}
	return fmt.Sprintf("exited %d", r.code)
}

// drainWait bounds how long runProc waits, after the command and its
// process group are gone, for its output pipes to close (on Windows a
// process the command started may still hold them).
const drainWait = 2 * time.Second

// groupGrace is how long what is left of the command's process group, once
// the command has exited, has to end after SIGTERM before it is killed.
const groupGrace = 500 * time.Millisecond

// runProc runs p in a process group of its own whose leader dies with this
// process (see setProcGroup), passes SIGINT and SIGTERM on to the group,
// copies its output through pipes, and, once the command has exited,
// ends what is left of its group (SIGTERM, then SIGKILL after groupGrace),
// so that nothing it started keeps running or holds the pipes. The caller
// holds off SIGPIPE (survivePipe) so that a closed standard output does not
// kill this process, and the command with it.
func runProc(p proc) procResult {
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	if p.stdin != nil {
		cmd.Stdin = p.stdin
	}
	own := setProcGroup(cmd)
	var copies sync.WaitGroup
	var readers []*os.File
	var copyErr error
	var copyMu sync.Mutex
	for _, s := range []struct {
		dst *io.Writer
		w   io.Writer
	}{{&cmd.Stdout, p.stdout}, {&cmd.Stderr, p.stderr}} {
		if s.w == nil {
			continue
		}
		pr, pw, err := os.Pipe()
		if err != nil {
			closeAll(readers)
			return procResult{err: err}
		}
		*s.dst = pw
		readers = append(readers, pr)
		copies.Go(func() {
			if _, err := io.Copy(s.w, pr); err != nil && !errors.Is(err, os.ErrClosed) {
				copyMu.Lock()
				copyErr = errors.Join(copyErr, err)
				copyMu.Unlock()
				io.Copy(io.Discard, pr) // a command blocked on a full pipe would never exit
			}
		})
	}
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)
	err := cmd.Start()
	for _, w := range []io.Writer{cmd.Stdout, cmd.Stderr} {
		if f, ok := w.(*os.File); ok {
			f.Close() // the child has its copy
		}
	}
	if err != nil {
		copies.Wait()
		closeAll(readers)
		return procResult{err: err}
	}
	var fwdMu sync.Mutex
	var forwarded os.Signal
	stop := make(chan struct{})
	fwdDone := make(chan struct{})
	go func() {
		defer close(fwdDone)
		for {
			select {
			case s := <-sigc:
				fwdMu.Lock()
				forwarded = s
				fwdMu.Unlock()
				signalGroup(cmd, own, s)
			case <-stop:
				return
			}
		}
	}()
	werr := cmd.Wait()
	close(stop)
	<-fwdDone
	killGroup(cmd, own)
	drained := make(chan struct{})
	go func() { copies.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainWait):
		closeAll(readers) // a descendant outside the group holds the pipes
		<-drained
	}
	closeAll(readers)
	res := procResult{started: true, forwarded: forwarded, err: copyErr}
	res.code, res.signal = exitStatus(cmd.ProcessState)
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) && res.err == nil {
		res.err = werr
	}
	return res
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// tee keeps a stream in file and shows it on term. A terminal that cannot
// be written to (a closed pipe) is given up on; the file is not.
type tee struct {
	file    io.Writer
	term    io.Writer
	termErr bool
}

func (t *tee) Write(p []byte) (int, error) {
	n, err := t.file.Write(p)
	if !t.termErr && t.term != nil {
		if _, terr := t.term.Write(p); terr != nil {
			t.termErr = true
		}
	}
	return n, err
}

// limitedBuffer keeps the first max bytes written to it and counts the rest.
type limitedBuffer struct {
	buf  []byte
	max  int
	over int64
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	room := b.max - len(b.buf)
	if room >= len(p) {
		b.buf = append(b.buf, p...)
	} else {
		b.buf = append(b.buf, p[:max(room, 0)]...)
		b.over += int64(len(p) - max(room, 0))
	}
	return len(p), nil
}
