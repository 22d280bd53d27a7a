package runstate

import (
	"bytes"
	"testing"
	"time"
)

// benchRecord is a complete record as a checkpoint writes it.
func benchRecord() *Record {
	return &Record{Seq: 123456, At: time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC), Ev: evComplete,
		Session: "01900000-0000-7000-8000-000000000001", Stage: "execute/file-042", Attempt: 3,
		Inputs:  map[string]string{"src/execute/file-042.go": "sha256:9bb55c900753009d0947e7b9f412ebf10edade998ca66470e8311f64d1e01d04"},
		Outputs: []Output{{Path: "artifacts/execute/file-042.txt", SHA256: "9bb55c900753009d0947e7b9f412ebf10edade998ca66470e8311f64d1e01d04", Size: 842}},
		Prev:    "c857f23e108d2c2e2d4e5f740493fb8632f298832374d336d1cc1475e8d4b558"}
}

// BenchmarkAppendRecord is the writer's cost of one line (encoding, and
// with it the text limits and the crc).
func BenchmarkAppendRecord(b *testing.B) {
	rec := benchRecord()
	var buf bytes.Buffer
	for i := 0; i < b.N; i++ {
		buf.Reset()
		if err := appendRecord(&buf, rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseLine is the reader's cost of one line (the fast path, and
// with it the crc check).
func BenchmarkParseLine(b *testing.B) {
	var buf bytes.Buffer
	if err := appendRecord(&buf, benchRecord()); err != nil {
		b.Fatal(err)
	}
	line := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	var d decoder
	var r Record
	b.SetBytes(int64(len(line)))
	for i := 0; i < b.N; i++ {
		if err := d.parse(line, "", &r); err != nil {
			b.Fatal(err)
		}
	}
}
