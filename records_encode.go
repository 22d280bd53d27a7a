package runstate

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
)

// encodeRecord appends r's ledger line (with its crc field and '\n') to
// buf by hand, byte for byte as appendRecordJSON writes it with
// encoding/json (the chain hashes the bytes: FuzzAppendRecordByHand and
// TestAppendRecordEveryField compare the two), without reflection and
// without an allocation for a checkpoint's records. It reports false,
// with buf holding a part of a line after its old length, for a record
// that encoding/json would refuse (a time outside the years 0-9999,
// data that is not JSON) or that makes a line longer than maxLine: the
// caller cuts it and lets appendRecordJSON say why.
func encodeRecord(buf *bytes.Buffer, r *Record) bool {
	start := buf.Len()
	b := buf.AvailableBuffer()
	b = append(b, `{"seq":`...)
	b = strconv.AppendInt(b, r.Seq, 10)
	b = append(b, `,"at":"`...)
	b, err := r.At.AppendText(b)
	if err != nil {
		return false
	}
	b = append(b, `","ev":`...)
	b = appendJSONString(b, r.Ev)
	b = appendField(b, `,"session":`, r.Session)
	b = appendField(b, `,"stage":`, r.Stage)
	if r.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(r.Attempt), 10)
	}
	if len(r.Inputs) > 0 {
		b = appendInputs(append(b, `,"inputs":`...), r.Inputs)
	}
	if len(r.Outputs) > 0 {
		b = append(b, `,"outputs":[`...)
		for i, o := range r.Outputs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"path":`...)
			b = appendJSONString(b, o.Path)
			b = append(b, `,"sha256":`...)
			b = appendJSONString(b, o.SHA256)
			b = append(b, `,"size":`...)
			b = strconv.AppendInt(b, o.Size, 10)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = appendField(b, `,"key":`, r.Key)
	b = appendField(b, `,"class":`, r.Class)
	b = appendField(b, `,"error":`, r.Error)
	b = appendField(b, `,"reason":`, r.Reason)
	b = appendField(b, `,"note":`, r.Note)
	b = appendField(b, `,"by":`, r.By)
	if len(r.Data) > 0 {
		// As encoding/json writes a json.RawMessage: checked and compacted.
		buf.Write(append(b, `,"data":`...))
		if json.Compact(buf, r.Data) != nil {
			return false
		}
		b = buf.AvailableBuffer()
	}
	b = append(b, `,"prev":`...)
	b = appendJSONString(b, r.Prev)
	buf.Write(b)
	if buf.Len()-start+len("}\n")+crcSuffix-1 > maxLine {
		return false
	}
	b = appendCRC(buf.AvailableBuffer(), buf.Bytes()[start:])
	buf.Write(append(b, '\n'))
	return true
}

// appendField appends an omitempty string field: name (with its comma,
// quotes and colon) and v, unless v is "".
func appendField(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	return appendJSONString(append(b, name...), v)
}

// appendInputs appends m as encoding/json writes a map[string]string:
// its keys sorted, both escaped.
func appendInputs(b []byte, m map[string]string) []byte {
	var room [8]string
	keys := room[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		b = appendJSONString(b, m[k])
	}
	return append(b, '}')
}
