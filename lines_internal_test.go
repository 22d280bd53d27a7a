package runstate

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestLineLimit: a line of maxLine bytes, its '\n' included (the longest a
// writer writes), reads; one byte more is too long when a '\n' ends it,
// and a torn tail when none does, however long, in both line sources.
func TestLineLimit(t *testing.T) {
	defer func() { asyncLinesOK = true }()
	line := func(n int, newline bool) []byte {
		b := bytes.Repeat([]byte("x"), n)
		if newline {
			b[n-1] = '\n'
		}
		return b
	}
	for _, tc := range []struct {
		name    string
		data    []byte
		lineLen int   // of the line next returns
		err     error // next's error
	}{
		{"maxLine with its newline", line(maxLine, true), maxLine, nil},
		{"one byte more, with a newline", line(maxLine+1, true), 0, errLineTooLong},
		{"twice as long, with a newline", line(2*maxLine, true), 0, errLineTooLong},
		{"maxLine, no newline", line(maxLine, false), maxLine, io.EOF},
		{"one byte more, no newline", line(maxLine+1, false), 0, errTornTooLong},
		{"twice as long, no newline", line(2*maxLine, false), 0, errTornTooLong},
	} {
		for _, async := range []bool{false, true} {
			asyncLinesOK = async
			src := newLineSource(io.NewSectionReader(bytes.NewReader(tc.data), 0, int64(len(tc.data))))
			got, _, err := src.next()
			src.stop()
			assert.Equal(t, tc.err, err, "%s, async %v", tc.name, async)
			assert.Equal(t, tc.lineLen, len(got), "%s, async %v", tc.name, async)
		}
	}
}
