package runstate

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// undoRecords is a run that has a record of every kind apply knows:
// stages through each state (review, approval, interruption, fatal and
// person failures, invalidation), effects through each state, sessions
// opening, closing and dying, a stage that is not planned.
func undoRecords() []*Record {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const a, b = "01900000-0000-7000-8000-00000000000a", "01900000-0000-7000-8000-00000000000b"
	recs := []*Record{
		{Ev: evCreate, Data: json.RawMessage(`{"id":"x","request":"r","format":1}`)},
		{Ev: evOpen, Session: a, Data: json.RawMessage(`{"pid":1,"host":"h"}`)},
		{Ev: evPlan, Session: a, Data: json.RawMessage(`["s1","s2","s3","s4"]`)},
		{Ev: evBegin, Session: a, Stage: "s1", Attempt: 1, Inputs: map[string]string{"f": "sha256:1"}},
		{Ev: evComplete, Session: a, Stage: "s1", Attempt: 1, Outputs: []Output{{Path: "o", SHA256: "ab", Size: 1}}},
		{Ev: evBegin, Session: a, Stage: "s2", Attempt: 1},
		{Ev: evFail, Session: a, Stage: "s2", Attempt: 1, Error: "e", Class: "retry", Reason: "r"},
		{Ev: evBegin, Session: a, Stage: "s2", Attempt: 2},
		{Ev: evAwait, Session: a, Stage: "s2", Attempt: 2, Reason: "look"},
		{Ev: evApprove, Session: a, Stage: "s2", By: "p"},
		{Ev: evIntent, Session: a, Key: "k1", Reason: "sha256:p", Data: json.RawMessage(`{"to":"x"}`)},
		{Ev: evConfirm, Session: a, Key: "k1", Data: json.RawMessage(`{"id":1}`), Note: checkedNote},
		{Ev: evIntent, Session: a, Key: "k2"},
		{Ev: evUnconfirmed, Session: a, Key: "k2", Reason: inDoubtReason},
		{Ev: evIntent, Session: a, Key: "k2"},
		{Ev: evUnconfirmed, Session: a, Key: "k2", Error: "x", Reason: pendingReason},
		{Ev: evResolve, Session: a, Key: "k2", By: "p"},
		{Ev: evOpen, Session: b, Data: json.RawMessage(`{"pid":2}`)},
		{Ev: evBegin, Session: b, Stage: "s3", Attempt: 1},
		{Ev: evInterrupted, Session: a, Stage: "s3", Attempt: 1, Reason: "gone"},
		{Ev: evBegin, Session: a, Stage: "s3", Attempt: 2},
		{Ev: evFail, Session: a, Stage: "s3", Attempt: 2, Error: "e", Class: ClassFatal},
		{Ev: evInvalidate, Session: a, Stage: "s3", By: "p", Reason: "redo"},
		{Ev: evBegin, Session: a, Stage: "extra", Attempt: 1},
		{Ev: evSkip, Session: a, Stage: "extra", Reason: "no"},
		{Ev: evInvalidate, Session: a, Stage: "s1", Reason: "stale"},
		{Ev: evBegin, Session: a, Stage: "s1", Attempt: 2},
		{Ev: evFail, Session: a, Stage: "s1", Attempt: 2, Error: "e", Class: ClassPerson},
		{Ev: evAwait, Session: a, Stage: "s4", Class: "c", Error: "e", Reason: "r"},
		{Ev: evInterrupted, Session: a, Data: json.RawMessage(`{"session":"` + b + `"}`)},
		{Ev: evClose, Session: a, Data: json.RawMessage(`{"skipped":1}`)},
	}
	for i, r := range recs {
		r.Seq, r.At = int64(i+1), at.Add(time.Duration(i)*time.Second)
	}
	return recs
}

// stateAfter applies recs to a new state.
func stateAfter(recs []*Record) *state {
	s := newState()
	for _, r := range recs {
		s.apply(r)
		s.pos = chain{seq: r.Seq, hash: fmt.Sprint("h", r.Seq), offset: r.Seq * 100, crc: true}
		s.lastLen = r.Seq
	}
	return s
}

// TestUndoTakesBackABatch: the records of a batch applied with the undo
// on, then taken back, leave the state equal (every field, every map
// entry, the plan index) to the state that never saw them, for every
// window of 1 to 4 records of a run with every kind of record; a window
// with a record the undo cannot take back (create, plan, an interrupted
// session) says so, and the committer reads instead (rollBack).
func TestUndoTakesBackABatch(t *testing.T) {
	recs := undoRecords()
	var u undo // reused, as the committer's
	for k := range recs {
		for m := 1; m <= 4 && k+m <= len(recs); m++ {
			want := stateAfter(recs[:k])
			got := stateAfter(recs[:k])
			got.startUndo(&u)
			broken := false
			for _, r := range recs[k : k+m] {
				got.apply(r)
				got.pos = chain{seq: r.Seq, hash: "other", offset: -1}
				got.lastLen = -1
				broken = broken || r.Ev == evCreate || r.Ev == evPlan || (r.Ev == evInterrupted && r.Stage == "")
			}
			ok := got.take(&u)
			require.Equal(t, !broken, ok, "records %d-%d: take's answer", k+1, k+m)
			require.Nil(t, got.u, "the undo is off after take")
			if ok {
				require.True(t, reflect.DeepEqual(want, got), "records %d-%d taken back:\nwant %+v\ngot  %+v", k+1, k+m, want, got)
			}
		}
	}
}
