package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holderArgs are the holder role's arguments.
type holderArgs struct {
	DSN string // with its schema
	Run string
}

// holding is what a holder reports once it holds the run: its session and
// the seq of its record, acknowledged.
type holding struct {
	Session string
	Seq     int64
}

// appendResult is what a holder reports after the parent's "append".
type appendResult struct {
	Seq  int64
	Err  string
	Lost bool // the error wraps ErrSessionLost
}

func init() { roles["holder"] = holderRole }

// holderRole opens the run in a session of its own, appends one synced
// record (as a Begin would: the session holds something now), reports
// "holding", then obeys: "append" appends one more synced record and
// reports "appended" (its error, if any), "close" closes cleanly; a closed
// stdin ends it as it is.
func holderRole(ctx context.Context, raw json.RawMessage, cio *childIO) error {
	var a holderArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return err
	}
	db, err := Connect(ctx, a.DSN)
	if err != nil {
		return err
	}
	defer db.Close()
	st := db.Store(a.Run)
	session := newSessionID()
	_, at, err := st.Open(ctx, session)
	if err != nil {
		return err
	}
	if at, err = markedBatch(ctx, st, at, session, "hold "+session, 1, true); err != nil {
		return err
	}
	cio.send("holding", holding{Session: session, Seq: at.Seq})
	for {
		switch cio.next() {
		case "append":
			actx, cancel := context.WithTimeout(ctx, 30*time.Second)
			pos, err := markedBatch(actx, st, at, session, "late "+session, 1, true)
			cancel()
			if err != nil {
				cio.send("appended", appendResult{Err: err.Error(), Lost: errors.Is(err, ErrSessionLost)})
				continue
			}
			at = pos
			cio.send("appended", appendResult{Seq: pos.Seq})
		case "close":
			return st.Close(true)
		case "":
			return nil
		}
	}
}

// probe is a session of the test's own on the run, that asks whether
// another session is alive the way a batch decides it: under the run's
// lock (Batch.Alive).
type probe struct {
	t       *testing.T
	st      Store
	session string
}

func newProbe(t *testing.T, db *DB, run string) *probe {
	t.Helper()
	st, session := db.Store(run), newSession(t)
	_, _, err := st.Open(context.Background(), session)
	require.NoError(t, err)
	t.Cleanup(func() { st.Close(true) })
	return &probe{t: t, st: st, session: session}
}

func (p *probe) alive(session string) bool {
	p.t.Helper()
	b, err := p.st.Lock(context.Background(), Position{})
	require.NoError(p.t, err)
	defer b.Abort()
	return b.Alive(session)
}

// sessionRecords are the seqs of session's records.
func sessionRecords(t *testing.T, db *DB, run, session string) []int64 {
	t.Helper()
	var seqs []int64
	for i, l := range readAll(t, db.Store(run)) {
		if strings.Contains(string(l), `"session":"`+session+`"`) {
			seqs = append(seqs, int64(i+1))
		}
	}
	return seqs
}

// A process holding the run is SIGKILLed: while it lived, the others'
// batches saw it alive (a stage of it would be ErrBusy); within a bound
// after the kill they see it gone (its stage would be interrupted), and
// it left nothing after its last acknowledged record. Five rounds; the
// median latency is logged.
func TestKilledProcessIsGoneWithinBound(t *testing.T) {
	dsn := withSchema(testDSN(t), newSchema(t))
	ctx := context.Background()
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	p := newProbe(t, db, "run")
	var lat []time.Duration
	for range 5 {
		ch := startChild(t, "holder", holderArgs{DSN: dsn, Run: "run"})
		var h holding
		ch.expect("holding", 30*time.Second, &h)
		require.True(t, p.alive(h.Session), "a live holder must be alive to the others")
		require.NoError(t, ch.cmd.Process.Kill())
		d, gone := poll(5*time.Second, time.Millisecond, func() bool { return !p.alive(h.Session) })
		require.True(t, gone, "the killed session %s is still alive to the others after %v", h.Session, d)
		lat = append(lat, d)
		ch.wait(10 * time.Second)
		assert.Equal(t, []int64{h.Seq}, sessionRecords(t, db, "run", h.Session), "the dead session's records: its last acknowledged one, nothing after")
	}
	slices.Sort(lat)
	t.Logf("SIGKILL -> session gone: median %v (min %v, max %v, %d rounds)", lat[len(lat)/2], lat[0], lat[len(lat)-1], len(lat))
}
