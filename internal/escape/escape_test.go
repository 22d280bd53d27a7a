package escape

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTextEscapesWhatDrivesATerminal(t *testing.T) {
	for in, want := range map[string]string{
		"plain text":                   "plain text",
		"":                             "",
		"\x1b[1A\x1b[2Kblockers: none": `\x1b[1A\x1b[2Kblockers: none`,
		"a\nb\r\tc":                    `a\nb\r\tc`,
		"\u202eevil":                   `\u202eevil`,
		"\u2066x\u2069":                `\u2066x\u2069`,
		"c1 \u009b2J":                  `c1 \u009b2J`,
		"bad \xff\xfe utf8":            `bad \xff\xfe utf8`,
		"real \ufffd kept":             "real \ufffd kept",
		`C:\x1b`:                       `C:\\x1b`,
		"del \x7f":                     `del \x7f`,
		"héllo wörld ✓":                "héllo wörld ✓",
		"tag \U000e0001":               `tag \U000e0001`,
	} {
		assert.Equal(t, want, Text(in), "%q", in)
		assertInert(t, Text(in), false)
	}
}

func TestPageKeepsLinesAndBackslashes(t *testing.T) {
	assert.Equal(t, "a\\b\nc\\x1b\n", Page("a\\b\nc\x1b\n"))
	assert.Equal(t, "x\\u202e\n", Page("x\u202e\n"))
	assertInert(t, Page("one\x1b[8m\ntwo\u202e\xff\n"), true)
}

// A tab in a page (a reason, a request, an error indented with tabs)
// stays a tab: it only moves the cursor forward on its line. The other
// controls that move it (back, up, down, to the start of the line, to a
// new page) and the sequences that set tab stops are escaped. Text and
// Arg escape tabs: Text is one field of a line, and a tab pasted into a
// shell completes.
func TestPageKeepsTabs(t *testing.T) {
	assert.Equal(t, "reason:\tdisk full\n\tretry later\n", Page("reason:\tdisk full\n\tretry later\n"))
	assert.Equal(t, `a\bb\rc\vd\fe\x1bHf\x1b[3gg\x7f`, Page("a\bb\rc\vd\fe\x1bHf\x1b[3gg\x7f"))
	assertInert(t, Page("one\ttwo\n\tthree\n"), true)
	assert.Equal(t, `a\tb`, Text("a\tb"))
	assert.Equal(t, `$'/tmp/a\tb'`, Arg("/tmp/a\tb"))
}

func TestArgQuotesForAShell(t *testing.T) {
	for in, want := range map[string]string{
		"/tmp/run-1":     "/tmp/run-1",
		"/tmp/my run":    "'/tmp/my run'",
		"it's":           `'it'\''s'`,
		"":               "''",
		"/tmp/\x1b[2J":   `$'/tmp/\x1b[2J'`,
		"a'\u202e":       `$'a\'\u202e'`,
		"$(rm -rf ~)":    "'$(rm -rf ~)'",
		"line\nbreak":    `$'line\nbreak'`,
		`C:\runs\r1`:     `'C:\runs\r1'`,
		"stage/with,=%?": "'stage/with,=%?'",
	} {
		assert.Equal(t, want, Arg(in), "%q", in)
		assertInert(t, Arg(in), false)
	}
}

func TestJSONStaysExactAndInert(t *testing.T) {
	v := map[string]string{"e": "\x1b[2J\u202e\u2028\u009b\U000e0001 ok é \xff"}
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	out := JSON(raw)
	assertInert(t, string(out), false)
	var back, want map[string]string
	require.NoError(t, json.Unmarshal(out, &back))
	require.NoError(t, json.Unmarshal(raw, &want))
	assert.Equal(t, want, back, "the same values")
	assert.Contains(t, string(out), `\u202e`)
	assert.Contains(t, string(out), "é")
	plain := []byte(`{"a":"b"}`)
	assert.Equal(t, plain, JSON(plain))
}

// assertInert checks that s holds no control character (but newlines and
// tabs, if lines), no unprintable rune and no invalid UTF-8.
func assertInert(t *testing.T, s string, lines bool) {
	t.Helper()
	assert.True(t, utf8.ValidString(s), "%q is valid UTF-8", s)
	for _, r := range s {
		if (r == '\n' || r == '\t') && lines {
			continue
		}
		assert.False(t, r < 0x20 || r == 0x7f || (r >= 0x80 && !strconv.IsPrint(r)), "%q holds %U", s, r)
	}
	assert.False(t, strings.ContainsAny(s, "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"))
}

// Text is unambiguous: Go's strconv.Unquote reads back exactly the text
// given (a quote is the one character Text leaves for Quote to escape).
func FuzzTextReadsBack(f *testing.F) {
	for _, s := range []string{"", "plain", "\x1b[2J", "\u202e", `C:\x1b`, "\xff\xfe", "a\"b", "\U000e0001", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := Text(s)
		assertInert(t, out, false)
		back, err := strconv.Unquote(`"` + strings.ReplaceAll(out, `"`, `\"`) + `"`)
		require.NoError(t, err, "%q", out)
		assert.Equal(t, s, back)
		assertInert(t, Page(s+"\n"+s), true)
		assertInert(t, Arg(s), false)
	})
}
