// Package escape makes text from a run's records safe to print on a
// terminal. Error texts, reasons, notes, names, keys and paths come from
// stages (and from whoever wrote the ledger): an ESC, a carriage return, a
// bidi override (U+202E) or invalid UTF-8 in them must not move the cursor
// back or up, erase, hide a line or reorder what a person reads.
//
// Text writes every such character the way Go's strconv.Quote does,
// without the quotes: \n, \r, \t and the other C escapes, \x1b for other
// ASCII controls and for each byte of invalid UTF-8, \u202e (or
// \U000e0001) for every other rune that strconv.IsPrint refuses: C1
// controls, bidi and other format characters, line and paragraph
// separators, spaces other than U+0020. A backslash is written \\, so
// the form is unambiguous: "\x1b" in the output is an escaped ESC, "\\x1b"
// the four characters as given. Page, for text already laid out as a
// page, keeps its newlines and tabs as they are.
//
// The functions write nothing and keep no state: they are safe for
// concurrent use.
package escape

import (
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Text returns s with every character that could act on a terminal
// escaped, and every backslash doubled (see the package doc). The result
// is one line of printable text. s itself is returned when nothing needs
// escaping (no allocation).
func Text(s string) string { return escape(s, true) }

// Page returns s, text already rendered for a person (a page such as
// logs/next-steps.txt, an error message), with the same characters
// escaped as Text escapes, except that newlines stay line breaks, tabs
// stay tabs, and backslashes stay as they are: the page's own escapes are
// not doubled. A tab only moves the cursor forward to the next tab stop
// on the same line, never back, up or down, and erases nothing: it cannot
// hide or overwrite what a person reads (the sequences that would set tab
// stops begin with ESC, which is escaped), and a reason or an error
// indented with tabs reads as it was written.
func Page(s string) string { return escape(s, false) }

// Arg returns s quoted for a POSIX shell when it needs it, so that a
// person can paste it: as it is when it holds only letters, digits and
// _-./:@+,% ; in single quotes when it holds other printable characters;
// and as $'...' (bash, zsh, ksh) with the escapes of Text when it holds
// anything Text escapes. The result never holds a control character.
func Arg(s string) string {
	if plain(s) {
		return s
	}
	if clean(s, false) && !strings.ContainsAny(s, "\n\t") { // a tab pasted into a shell completes
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	return "$'" + strings.ReplaceAll(Text(s), "'", `\'`) + "'"
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_-./:@+,%", c) >= 0) {
			return false
		}
	}
	return s != ""
}

// clean reports whether escape would return s unchanged.
func clean(s string, text bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && (text || c != '\n' && c != '\t') || c == 0x7f || text && c == '\\' {
				return false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 || !strconv.IsPrint(r) {
			return false
		}
		i += n
	}
	return true
}

const hex = "0123456789abcdef"

func escape(s string, text bool) string {
	if clean(s, text) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for len(s) > 0 {
		r, n := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteByte(hex[s[0]>>4])
			b.WriteByte(hex[s[0]&0xf])
		case (r == '\n' || r == '\t') && !text:
			b.WriteByte(byte(r))
		case r == '\\':
			if text {
				b.WriteByte('\\')
			}
			b.WriteByte('\\')
		case r >= 0x20 && r < 0x7f, r >= 0x80 && strconv.IsPrint(r):
			b.WriteString(s[:n])
		default:
			// strconv.Quote's escapes for controls and the unprintable.
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		s = s[n:]
	}
	return b.String()
}

// JSON rewrites, in JSON that encoding/json produced, every rune that
// strconv.IsPrint refuses (bidi overrides such as U+202E, other format
// characters, C1 controls) as a \u escape, so that the JSON decodes to
// exactly the same values and yet shows nothing a terminal acts on when
// it is printed as it is. encoding/json already escapes the ASCII
// controls, U+2028 and U+2029, and writes invalid UTF-8 as U+FFFD; every
// other non-ASCII byte it writes is inside a string, where a \u escape
// means the same rune.
func JSON(b []byte) []byte {
	i := 0
	for i < len(b) && b[i] < utf8.RuneSelf {
		i++
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			out = append(out, b[i])
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if strconv.IsPrint(r) || (r == utf8.RuneError && n == 1) {
			out = append(out, b[i:i+n]...)
		} else if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError {
			out = appendU(appendU(out, r1), r2)
		} else {
			out = appendU(out, r)
		}
		i += n
	}
	return out
}

func appendU(b []byte, r rune) []byte {
	return append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
}
