package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The server crashes in the middle of a run (pg_ctl stop -m immediate: no
// checkpoint, the WAL is replayed at the next start) while four sessions
// append; it starts again. Every acknowledged batch is in the table with
// its hash, seq is gapless, the chain intact, no record twice; the
// sessions take their locks again within the restart grace and go on
// appending, without opening the run again.
func TestServerCrashKeepsEveryAcknowledgedRecord(t *testing.T) {
	srv := startServer(t, nil, nil)
	ctx := context.Background()
	db, err := Connect(ctx, srv.DSN("127.0.0.1")+"&schema=crash")
	require.NoError(t, err)
	defer db.Close()

	const writers = 4
	c := &crashRun{db: db, log: newAckLog(), stop: make(chan struct{})}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	after := make([]atomic.Int32, writers) // acknowledged batches after the restart, per writer
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- c.writer(ctx, w, &after[w])
		}()
	}
	waitFor(t, 10*time.Second, func() bool { return c.log.len() >= 40 }, "40 acknowledged batches before the crash")
	before := c.log.len()
	down := time.Now()
	srv.Crash(t)
	srv.Start(t)
	c.restarted.Store(true)
	downFor := time.Since(down)
	t.Logf("%d batches acknowledged before the crash; the server was down for %v", before, downFor.Round(time.Millisecond))
	waitFor(t, 30*time.Second, func() bool {
		for w := range writers {
			if after[w].Load() < 5 {
				return false
			}
		}
		return true
	}, "every writer's 5 acknowledged batches after the restart")
	resumed := time.Since(down) - downFor
	close(c.stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}

	n := c.log.check(t, readAll(t, db.Store("run")))
	t.Logf("%d records, %d acknowledged batches; every writer resumed within %v of the restart; %d sessions opened again",
		n, c.log.len(), resumed.Round(time.Millisecond), c.reopened.Load())
	c.lost.Range(func(k, _ any) bool { t.Logf("a session was lost: %v", k); return true })
	// A session gives up after lostAfter without its lock (session.go),
	// counted from its last good ping, up to pingEvery before the crash:
	// only a server back well within that must find every session again.
	if downFor < lostAfter-pingEvery-pingEvery/2 {
		assert.Zero(t, c.reopened.Load(), "the server was back after %v, yet a session did not take its lock again: it had to open the run again", downFor)
	} else {
		t.Logf("the server was down for %v, longer than a session waits (lostAfter %v): sessions that gave up opened the run again", downFor, lostAfter)
	}
}

// crashRun is the writers' shared state.
type crashRun struct {
	db        *DB
	log       *ackLog
	stop      chan struct{}
	restarted atomic.Bool
	reopened  atomic.Int32 // sessions lost and replaced
	lost      sync.Map     // their errors
}

// writer appends batches of 1-3 synced records to run "run" until stop,
// logging each acknowledged one (and counting, in after, those after the
// restart). A failed batch is not acknowledged; the writer goes on from
// the last position it knows (the next batch's Tail brings it up to date,
// its own lines included if the failed batch landed after all). A session
// that is lost (ErrSessionLost) is replaced by a new one.
func (c *crashRun) writer(ctx context.Context, w int, after *atomic.Int32) error {
	open := func() (runstate.Store, string, runstate.Position, error) {
		for {
			st, session := c.db.Store("run"), newSessionID()
			_, at, err := st.Open(ctx, session)
			if err == nil {
				return st, session, at, nil
			}
			select {
			case <-c.stop:
				return nil, "", runstate.Position{}, err
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	st, session, at, err := open()
	if err != nil {
		return err
	}
	defer func() { st.Close(true) }()
	for i := 0; ; i++ {
		select {
		case <-c.stop:
			return nil
		default:
		}
		wasUp := c.restarted.Load()
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		pos, err := markedBatch(bctx, st, at, session, fmt.Sprintf("w%d-%d", w, i), 1+i%3, true)
		cancel()
		switch {
		case err == nil:
			c.log.ack(pos)
			at = pos
			if wasUp {
				after.Add(1)
			}
		case errors.Is(err, runstate.ErrSessionLost):
			c.lost.Store(err.Error(), true)
			c.reopened.Add(1)
			st.Close(false)
			if st, session, at, err = open(); err != nil {
				return err
			}
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// The server crashes while two Runs (two working directories) checkpoint
// stages with Do; it starts again and they go on. Every stage whose Do
// returned nil has exactly one complete; no stage has two; the ledger
// verifies; each Run finishes its stages. A Do that failed around the
// crash leaves its stage running (its begin landed); for up to the
// restart grace the stage is busy (sessions count as alive); a writer
// whose Do keeps failing for 3 s opens the run again, as a user would,
// and the new session takes the stage over. How often is logged.
func TestServerCrashRunsResume(t *testing.T) {
	srv := startServer(t, nil, nil)
	ctx := context.Background()
	dsn := srv.DSN("127.0.0.1") + "&schema=crashrun"
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	const runs, stages = 2, 60
	var acked [runs][]string
	var reopened atomic.Int32
	var done atomic.Int32
	var wg sync.WaitGroup
	for w := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dir := t.TempDir()
			open := func() *runstate.Run {
				for {
					r, err := db.Open(ctx, "run", dir, &runstate.Options{Request: "pgfault crash"})
					if err == nil {
						return r
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			run := open()
			defer func() { run.Close() }()
			var failing time.Time // since when Do fails, or zero
			var first error
			for i := 0; i < stages; {
				name := fmt.Sprintf("w%d-s%d", w, i)
				dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				err := run.Do(dctx, name, func(context.Context, *runstate.Stage) error { return nil })
				cancel()
				switch {
				case err == nil:
					acked[w] = append(acked[w], name)
					done.Add(1)
					i, failing = i+1, time.Time{}
					continue
				case failing.IsZero():
					failing, first = time.Now(), err
				case time.Since(failing) > time.Minute:
					t.Errorf("run %d: %s failed for a minute; the first error: %v; the last: %v", w, name, first, err)
					return
				}
				if errors.Is(err, runstate.ErrReadOnly) || errors.Is(err, runstate.ErrSessionLost) || time.Since(failing) > 3*time.Second {
					t.Logf("run %d: opened again after %s failed: %v", w, name, err)
					reopened.Add(1)
					run.Close()
					run = open()
					continue
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	waitFor(t, 20*time.Second, func() bool { return done.Load() >= 20 }, "20 stages done before the crash")
	srv.Crash(t)
	srv.Start(t)
	wg.Wait()
	recs := ledger(t, db, "run")
	for w := range runs {
		for _, s := range acked[w] {
			c := 0
			for _, n := range completesOf(recs, s) {
				c += n
			}
			assert.Equal(t, 1, c, "acknowledged stage %s: one complete (of attempt 1, or of a later one after a failed Do)", s)
		}
	}
	n := map[string]int{}
	for _, r := range recs {
		if r.Ev == "complete" {
			n[r.Stage]++
		}
	}
	for s, c := range n {
		assert.Equal(t, 1, c, "stage %s completed %d times", s, c)
	}
	rep, err := db.Verify(ctx, "run")
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep.Problems)
	t.Logf("%d records, %d stages done; Runs opened again after the crash: %d", len(recs), done.Load(), reopened.Load())
}
