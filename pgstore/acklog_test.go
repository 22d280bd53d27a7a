package pgstore

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/runstate/runstate"
)

// ackLog is the client's log of acknowledgements: every record whose
// batch's Sync returned nil, with its hash, as the caller was told. A
// fault test checks the table against it afterwards. Safe for concurrent
// use.
type ackLog struct {
	mu   sync.Mutex
	acks map[int64]string // seq -> hex sha256 of the line
}

func newAckLog() *ackLog { return &ackLog{acks: map[int64]string{}} }

// ack notes that the batch ending at pos was acknowledged. A batch lands
// whole or not at all, and the chain check covers the records before its
// last, so the last one stands for the batch.
func (l *ackLog) ack(pos runstate.Position) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acks[pos.Seq] = pos.Hash
}

func (l *ackLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acks)
}

// check compares the run's lines with the log: every acknowledged record
// is there with its hash, seq is gapless from 1, each line's prev is its
// predecessor's hash, and no line appears twice (markers are unique per
// record). It returns the number of lines.
func (l *ackLog) check(t *testing.T, lines [][]byte) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	seen := map[string]int64{}
	prev := ""
	for i, line := range lines {
		var r struct {
			Seq  int64  `json:"seq"`
			Note string `json:"note"`
			Prev string `json:"prev"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			t.Errorf("line %d is not a record: %v: %s", i+1, err, line)
			continue
		}
		if r.Seq != int64(i+1) {
			t.Errorf("line %d has seq %d: not gapless", i+1, r.Seq)
		}
		if r.Prev != prev {
			t.Errorf("record %d: prev %q, but record %d's hash is %q: the chain is broken", r.Seq, r.Prev, r.Seq-1, prev)
		}
		if r.Note != "" {
			if at, dup := seen[r.Note]; dup {
				t.Errorf("record %q is there twice: seq %d and %d", r.Note, at, r.Seq)
			}
			seen[r.Note] = r.Seq
		}
		prev = lineHash(line)
	}
	for seq, h := range l.acks {
		switch {
		case seq > int64(len(lines)):
			t.Errorf("acknowledged record %d is gone: the run ends at %d", seq, len(lines))
		case lineHash(lines[seq-1]) != h:
			t.Errorf("acknowledged record %d is not the record there (hash %s, acknowledged %s): %s", seq, lineHash(lines[seq-1]), h, lines[seq-1])
		}
	}
	return len(lines)
}

// newSessionID is a new session id, for goroutines (newSession needs a t).
func newSessionID() string { return uuid.Must(uuid.NewV7()).String() }
