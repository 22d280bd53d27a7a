package runstate

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// byHandAndJSON encodes rec after prefix with appendRecord (by hand) and
// with appendRecordJSON (encoding/json), and requires the same bytes, or
// an error from both.
func byHandAndJSON(t *testing.T, prefix string, rec *Record) {
	t.Helper()
	var hand bytes.Buffer
	hand.WriteString(prefix)
	herr := appendRecord(&hand, rec) // cuts rec's free text: both encode the cut record
	var whole bytes.Buffer
	whole.WriteString(prefix)
	werr := appendRecordJSON(&whole, rec)
	if werr != nil || herr != nil {
		require.Equal(t, werr != nil, herr != nil, "encoding/json: %v, by hand: %v", werr, herr)
		require.Equal(t, werr.Error(), herr.Error())
		assert.Equal(t, prefix, hand.String(), "a refused record leaves the buffer as it was")
		return
	}
	require.Equal(t, whole.String(), hand.String())
}

// FuzzAppendRecordByHand: the ledger line encodeRecord writes by hand is
// encoding/json's, byte for byte (the chain hashes these bytes), for any
// strings (HTML, U+2028, control characters, invalid UTF-8, long text that
// cutText shortens), several inputs and outputs, any data (compacted, or
// refused when it is not JSON) and any time (a year outside 0-9999, or a
// zone encoding/json refuses, is an error either way).
func FuzzAppendRecordByHand(f *testing.F) {
	f.Add(int64(1), int64(1700000000), int64(123456789), "create", "s", "", "", 0, "", "", []byte(`{"id":"x","request":"r","format":1}`), "", int64(0), 0, 0, "")
	f.Add(int64(7), int64(0), int64(0), "complete", "stage/1", "", "", 2, "", "why", []byte(nil), "artifacts/a b.txt", int64(12), 3, 0, "p")
	f.Add(int64(9), int64(-5), int64(1), "intent", "", "ticket:42", "line\nbreak\x00\b\f\x7f", 1, "\"quoted\" \\", "<html>&", []byte(`{"a":[1,2,{"b":null}]}`), "", int64(-1), 9, 3600, "k\u2029")
	f.Add(int64(3), int64(1), int64(2), "confirm", "", "k\xff", "", 0, "\xff\xfe", "", []byte(`"s"`), "é/ü\xc3", int64(0), 12, -7200, "")
	f.Add(int64(4), int64(2), int64(3), "begin", "\u2028stage", "", "", 1, "", "", []byte(`  { "x" : 1 }  `), "é/ü", int64(3), 1, 0, "")
	f.Add(int64(5), int64(253402300800), int64(0), "fail", "s", "", "e", 1, "", "", []byte(`{"a":`), "", int64(0), 0, 0, "") // the year 10000; data not JSON
	f.Add(int64(6), int64(100), int64(0), "fail", "s", "", strings.Repeat("é", 3000), 1, "", "", []byte(nil), "", int64(0), 0, 86400, "")
	f.Fuzz(func(t *testing.T, seq, sec, nsec int64, ev, stage, key, errText string, attempt int, note, reason string, data []byte, outPath string, size int64, n, zone int, prefix string) {
		at := time.Unix(sec, nsec).UTC()
		if zone != 0 {
			at = at.In(time.FixedZone("z", zone%(100*3600)))
		}
		rec := &Record{Seq: seq, At: at, Ev: ev, Session: "01890a5d-ac96-774b-bcce-b30209900001",
			Stage: stage, Attempt: attempt, Key: key, Class: reason, Error: errText, Note: note, Reason: reason, By: note,
			Data: data, Prev: strings.Repeat("ab", 32)}
		for i := range min(max(n, 0), 20) {
			p := outPath + strconv.Itoa(i%11) // some paths twice: outputs may repeat, input keys may not
			rec.Outputs = append(rec.Outputs, Output{Path: p, SHA256: strings.Repeat("0", 64), Size: size + int64(i)})
			if rec.Inputs == nil {
				rec.Inputs = map[string]string{}
			}
			rec.Inputs[p] = "sha256:" + errText
		}
		byHandAndJSON(t, prefix, rec)
	})
}

// TestAppendRecordEveryField sets every field of a Record and its Outputs,
// found by reflection, and checks the line written by hand against
// encoding/json's: a field added to Record and not to encodeRecord fails
// here (and the line would lose it), where the fuzz target, which sets
// fields by name, would not notice. Also: an empty record, and the
// refused ones.
func TestAppendRecordEveryField(t *testing.T) {
	var rec Record
	fillEveryField(t, reflect.ValueOf(&rec).Elem(), "Record")
	rec.Data = json.RawMessage(` {"x": [1, "<&>\u2028"], "y": {}} `) // JSON, not compact
	for _, k := range []string{"b", "a", "c\u2029", "\x01", "\xff"} {
		rec.Inputs[k] = "v " + k // more than one, to sort
	}
	byHandAndJSON(t, "", &rec)
	for i := range reflect.TypeOf(rec).NumField() {
		// Each field left out in turn: omitempty, or written as zero.
		one := rec
		f := reflect.ValueOf(&one).Elem().Field(i)
		f.Set(reflect.Zero(f.Type()))
		byHandAndJSON(t, "before\n", &one)
	}
	byHandAndJSON(t, "", &Record{})
	byHandAndJSON(t, "x", &Record{Seq: 1, Ev: "e", At: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	byHandAndJSON(t, "x", &Record{Seq: 1, Ev: "e", Data: json.RawMessage(`{"a":}`)})
	byHandAndJSON(t, "x", &Record{Seq: 1, Ev: "e", Data: json.RawMessage(`"` + strings.Repeat("a", maxLine) + `"`)})
}

// TestAppendRecordAllocatesNothing: a checkpoint's complete record is
// encoded without an allocation (no reflection, no encoder): the
// committer encodes two records a checkpoint under the run's lock.
func TestAppendRecordAllocatesNothing(t *testing.T) {
	rec := benchRecord()
	var buf bytes.Buffer
	require.NoError(t, appendRecord(&buf, rec))
	allocs := testing.AllocsPerRun(100, func() {
		buf.Reset()
		if err := appendRecord(&buf, rec); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "allocations per appendRecord")
}
