package runstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"unicode"
	"unicode/utf8"
)

// What a record may hold. The reader refuses a line longer than maxLine
// and JSON nested deeper than encoding/json's 10,000 levels; so that
// every record the writer acknowledges reads back, values are held to
// smaller limits before anything is recorded (the package documentation
// states them):
//
//   - free text (error, reason, note, by) longer than maxText is cut, with
//     a marker saying how much was cut (cutText);
//   - a JSON value (a receipt, an effect's request, the plan, the input
//     set, the run identity) longer than maxValue, or nested deeper than
//     maxDepth, or holding a key twice, is refused with ErrInvalid;
//   - an effect key longer than maxKey is refused with ErrInvalid.
//
// And the leader encodes no line the reader would refuse (appendRecord):
// such a transaction fails alone.
const (
	maxText  = 64 << 10
	maxValue = 4 << 20
	maxDepth = 200 // jq 1.6 stops at 256
	maxKey   = 4 << 10

	// jsonDepth is encoding/json's nesting limit: the reader's.
	jsonDepth = 10000
)

// cutText returns s as the ledger's reader reads it back (validText) if
// that fits maxText bytes, and otherwise its start, cut at a character
// boundary, followed by "… [cut: N bytes]", maxText bytes at most in all.
func cutText(s string) string {
	s = validText(s)
	if len(s) <= maxText {
		return s
	}
	keep := maxText - len(cutMarker(len(s))) // the marker for len(s) is at least as long as any
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + cutMarker(len(s)-keep)
}

// validText returns s with each byte that is not part of valid UTF-8
// replaced by U+FFFD, as the records' encoder writes it (encoding/json's
// rule: one U+FFFD a byte, where strings.ToValidUTF8 would put one for a
// run of them): the text a reader decodes. A record's free text (a Fail's
// error, a Skip's reason) is held in memory so, or the manifest a session
// writes from memory would not be the one a reader makes of the ledger
// (its checksum refused by Verify).
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return string(b)
}

func cutMarker(n int) string { return fmt.Sprintf("… [cut: %d bytes]", n) }

// checkValue refuses a JSON value a record must not hold: longer than
// maxValue, not JSON, nested deeper than maxDepth, or with a key given
// twice in one object. what names the value in the error ("effect mail:
// receipt").
func checkValue(what string, v []byte) error {
	if len(v) > maxValue {
		return fmt.Errorf("%w: %s is %d bytes, more than the %d bytes a ledger record may hold: write it to an output file and record its path instead",
			ErrInvalid, what, len(v), maxValue)
	}
	if err := checkJSON(v, maxDepth); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, what, err)
	}
	return nil
}

// checkSize refuses an encoded value (the plan, the input set, the run
// identity) longer than maxValue.
func checkSize(what string, n int) error {
	if n > maxValue {
		return fmt.Errorf("%w: %s encodes to %d bytes, more than the %d bytes a ledger record may hold",
			ErrInvalid, what, n, maxValue)
	}
	return nil
}

// checkInputSet refuses a stage's inputs whose names and fingerprints
// would not fit maxValue in its begin and complete records.
func checkInputSet(inputs []Input) error {
	const fp = len(`"":"sha256:",`) + 64 // a fingerprint and the JSON around a name
	n, names := 2, 0
	for _, in := range inputs {
		n += fp
		names += len(in.name)
	}
	if n+6*names <= maxValue { // no name escapes to more than 6 bytes a byte
		return nil
	}
	list := make([]string, 0, len(inputs))
	for _, in := range inputs {
		list = append(list, in.name)
	}
	data, _ := json.Marshal(list)
	return checkSize(fmt.Sprintf("the input set of %d inputs", len(inputs)), n+len(data))
}

// checkIdentity refuses a run identity (Options.Request, Revision and
// Environment), recorded in the create record and each open record,
// larger than maxValue or with a string that is not valid UTF-8: JSON
// would record U+FFFD in place of the bad bytes, and a Request recorded so
// would never match the one given again.
func checkIdentity(o *Options) error {
	if err := checkUTF8("Options.Request", "", o.Request); err != nil {
		return err
	}
	if err := checkUTF8("Options.Revision", "", o.Revision); err != nil {
		return err
	}
	for k, v := range o.Environment {
		if err := checkUTF8("Options.Environment", "a key", k); err != nil {
			return err
		}
		if err := checkUTF8("Options.Environment", fmt.Sprintf("the value of %q", k), v); err != nil {
			return err
		}
	}
	n := len(o.Request) + len(o.Revision)
	for k, v := range o.Environment {
		n += len(k) + len(v)
	}
	if 6*n+256 <= maxValue {
		return nil
	}
	data, _ := json.Marshal(runIdentity{Request: o.Request, Revision: o.Revision, Environment: o.Environment})
	return checkSize("the run identity (Options.Request, Revision and Environment)", len(data))
}

// checkUTF8 refuses s, the part (of option) named by part ("" for all
// of it), when it is not valid UTF-8, naming the first bad byte.
func checkUTF8(option, part, s string) error {
	if utf8.ValidString(s) {
		return nil
	}
	at := 0
	for at < len(s) {
		r, n := utf8.DecodeRuneInString(s[at:])
		if r == utf8.RuneError && n == 1 {
			break
		}
		at += n
	}
	if part != "" {
		part = " (" + part + ")"
	}
	return fmt.Errorf("%w: %s is not valid UTF-8%s: byte %d is %#x; the ledger records text, with U+FFFD in place of such bytes, so the run would not match it again: pass text (encode bytes as hex or base64)",
		ErrInvalid, option, part, at, s[at])
}

// The per-line checksum: each line the writer appends ends with
// ,"crc":"<8 hex digits>"} where the digits are the CRC-32C of the
// line's bytes before that field (see the package documentation).
const (
	crcField  = `,"crc":"`
	crcSuffix = len(crcField) + 8 + len(`"}`)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendCRC appends the checksum field of line, an encoded record
// without its closing '}', and the closing '}'.
func appendCRC(b, line []byte) []byte {
	const hexDigits = "0123456789abcdef"
	sum := crc32.Checksum(line, castagnoli)
	b = append(b, crcField...)
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, hexDigits[sum>>uint(shift)&0xf])
	}
	return append(b, '"', '}')
}

// hasCRC reports whether line (without '\n'), a record that reads, ends
// with a crc field.
func hasCRC(line []byte) bool {
	n := len(line) - crcSuffix
	return n >= 1 && string(line[n:n+len(crcField)]) == crcField && line[len(line)-1] == '}'
}

// checkCRC verifies the checksum of line (without '\n'), whose crc field
// the decoder found: it must be the line's last field, as written, and
// match.
func checkCRC(line []byte) error {
	n := len(line) - crcSuffix
	if n < 1 || string(line[n:n+len(crcField)]) != crcField || string(line[len(line)-2:]) != `"}` {
		return errors.New(`the "crc" field is not the line's last, as runstate writes it (the line was rewritten?)`)
	}
	want := line[n+len(crcField) : len(line)-2]
	var got [crcSuffix]byte
	sum := appendCRC(got[:0], line[:n])[len(crcField) : crcSuffix-2]
	if string(sum) != string(want) {
		return fmt.Errorf("checksum %s does not match the line's bytes (%s): the line changed after it was written (a flipped bit?)", want, sum)
	}
	return nil
}

// crcOK reports whether checkCRC accepts line, without making an error:
// replay's line source computes it ahead of decoding (lines.go), and
// parseChecked then checks no crc again.
func crcOK(line []byte) bool {
	n := len(line) - crcSuffix
	if n < 1 || string(line[n:n+len(crcField)]) != crcField || string(line[len(line)-2:]) != `"}` {
		return false
	}
	var got [crcSuffix]byte
	return string(appendCRC(got[:0], line[:n])) == string(line[n:])
}

// Known fields, for the exact-key rule: encoding/json matches a key to a
// field without regard to case (and with Unicode folding: "ſeq" is seq),
// jq and most other readers do not, so a key that differs from a known
// field by case alone would make the ledger mean two things.
var (
	recordFields = []string{"seq", "at", "ev", "session", "stage", "attempt", "inputs", "outputs",
		"key", "class", "error", "reason", "note", "by", "data", "prev", "crc"}
	outputFields = []string{"path", "sha256", "size"}
)

// foldKey folds s as encoding/json does to match a key to a field.
func foldKey(s string) string {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A'
			}
			b = append(b, byte(r))
			continue
		}
		b = utf8.AppendRune(b, unicode.ToUpper(unicode.ToLower(r)))
	}
	return string(b)
}

// checkKnown refuses a key that encoding/json would take for one of the
// known fields, but is not exactly it.
func checkKnown(key string, known []string) error {
	f := foldKey(key)
	for _, k := range known {
		if k != key && foldKey(k) == f {
			return fmt.Errorf("key %q differs from the field %q only by case", key, k)
		}
	}
	return nil
}

// Schemas for jsonCheck: which objects have known fields.
const (
	schemaNone    = iota
	schemaRecord  // a ledger line
	schemaOutputs // its outputs list
	schemaOutput  // an element of it
)

// checkJSON reports whether b is one JSON value, as encoding/json reads
// it, nested maxDepth levels at most, with no key given twice in an object
// (compared after unescaping, as encoding/json does).
func checkJSON(b []byte, maxDepth int) error {
	c := jsonCheck{parser: parser{b: b}, max: maxDepth}
	return c.all(schemaNone)
}

// checkLine applies the exact-key rules to a ledger line (without '\n')
// that the fast path did not read: checkJSON's, and no key at the top
// level or in an output that differs from a known field only by case.
// crc reports whether the line has a top-level crc field.
func checkLine(line []byte) (crc bool, err error) {
	c := jsonCheck{parser: parser{b: line}, max: jsonDepth}
	err = c.all(schemaRecord)
	return c.crc, err
}

// jsonCheck is a JSON validator for checkJSON and checkLine (on the
// fast path's parser, for its white space).
type jsonCheck struct {
	parser
	max int
	crc bool // a top-level "crc" key was seen (schemaRecord)
}

func (c *jsonCheck) all(schema int) error {
	c.ws()
	if err := c.value(1, schema); err != nil {
		return err
	}
	c.ws()
	if c.i != len(c.b) {
		return c.errf("data after the value")
	}
	return nil
}

func (c *jsonCheck) errf(format string, args ...any) error {
	return fmt.Errorf("not valid JSON at byte %d: %s", c.i, fmt.Sprintf(format, args...))
}

func (c *jsonCheck) value(depth, schema int) error {
	if c.i >= len(c.b) {
		return c.errf("unexpected end")
	}
	switch ch := c.b[c.i]; {
	case ch == '{':
		if depth > c.max {
			return fmt.Errorf("nested deeper than %d levels", c.max)
		}
		return c.object(depth, schema)
	case ch == '[':
		if depth > c.max {
			return fmt.Errorf("nested deeper than %d levels", c.max)
		}
		return c.array(depth, schema)
	case ch == '"':
		_, _, err := c.str()
		return err
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	case ch == '-' || ch >= '0' && ch <= '9':
		return c.number()
	}
	return c.errf("unexpected %q", c.b[c.i])
}

func (c *jsonCheck) literal(s string) error {
	if len(c.b)-c.i < len(s) || string(c.b[c.i:c.i+len(s)]) != s {
		return c.errf("not %s", s)
	}
	c.i += len(s)
	return nil
}

func (c *jsonCheck) number() error {
	digits := func() int {
		n := 0
		for c.i < len(c.b) && c.b[c.i] >= '0' && c.b[c.i] <= '9' {
			c.i++
			n++
		}
		return n
	}
	if c.b[c.i] == '-' {
		c.i++
	}
	if c.i < len(c.b) && c.b[c.i] == '0' {
		c.i++
	} else if digits() == 0 {
		return c.errf("bad number")
	}
	if c.i < len(c.b) && c.b[c.i] == '.' {
		c.i++
		if digits() == 0 {
			return c.errf("bad number")
		}
	}
	if c.i < len(c.b) && (c.b[c.i] == 'e' || c.b[c.i] == 'E') {
		c.i++
		if c.i < len(c.b) && (c.b[c.i] == '+' || c.b[c.i] == '-') {
			c.i++
		}
		if digits() == 0 {
			return c.errf("bad number")
		}
	}
	return nil
}

// str reads a string and returns its bytes between the quotes; plain is
// true when they hold no escape and no byte above ASCII (the bytes are
// then the string encoding/json reads).
func (c *jsonCheck) str() (raw []byte, plain bool, err error) {
	start := c.i
	c.i++ // the quote
	plain = true
	for c.i < len(c.b) {
		switch ch := c.b[c.i]; {
		case ch == '"':
			c.i++
			return c.b[start+1 : c.i-1], plain, nil
		case ch == '\\':
			plain = false
			c.i++
			if c.i >= len(c.b) {
				return nil, false, c.errf("unexpected end")
			}
			switch c.b[c.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				c.i++
			case 'u':
				c.i++
				for k := 0; k < 4; k++ {
					if c.i >= len(c.b) || !isHex(c.b[c.i]) {
						return nil, false, c.errf("bad \\u escape")
					}
					c.i++
				}
			default:
				return nil, false, c.errf("bad escape")
			}
		case ch < 0x20:
			return nil, false, c.errf("control character in a string")
		default:
			if ch >= utf8.RuneSelf {
				plain = false
			}
			c.i++
		}
	}
	return nil, false, c.errf("unexpected end in a string")
}

func isHex(ch byte) bool {
	return ch >= '0' && ch <= '9' || ch >= 'a' && ch <= 'f' || ch >= 'A' && ch <= 'F'
}

func (c *jsonCheck) array(depth, schema int) error {
	c.i++
	c.ws()
	if c.i < len(c.b) && c.b[c.i] == ']' {
		c.i++
		return nil
	}
	elem := schemaNone
	if schema == schemaOutputs {
		elem = schemaOutput
	}
	for {
		c.ws()
		if err := c.value(depth+1, elem); err != nil {
			return err
		}
		c.ws()
		if c.i >= len(c.b) {
			return c.errf("unexpected end in an array")
		}
		switch c.b[c.i] {
		case ',':
			c.i++
		case ']':
			c.i++
			return nil
		default:
			return c.errf("unexpected %q in an array", c.b[c.i])
		}
	}
}

func (c *jsonCheck) object(depth, schema int) error {
	c.i++
	c.ws()
	if c.i < len(c.b) && c.b[c.i] == '}' {
		c.i++
		return nil
	}
	var known []string
	switch schema {
	case schemaRecord:
		known = recordFields
	case schemaOutput:
		known = outputFields
	}
	var keys []string
	var seen map[string]bool // for a large object
	for {
		c.ws()
		if c.i >= len(c.b) || c.b[c.i] != '"' {
			return c.errf("want a key")
		}
		raw, plain, err := c.str()
		if err != nil {
			return err
		}
		key := string(raw)
		if !plain {
			if json.Unmarshal(c.b[c.i-len(raw)-2:c.i], &key) != nil {
				return c.errf("bad key")
			}
		}
		if seen == nil && len(keys) == 16 {
			seen = make(map[string]bool, 32)
			for _, k := range keys {
				seen[k] = true
			}
		}
		dup := seen[key]
		if seen == nil {
			for _, k := range keys {
				dup = dup || k == key
			}
			keys = append(keys, key)
		} else {
			seen[key] = true
		}
		if dup {
			return fmt.Errorf("key %q given twice in one object", key)
		}
		if known != nil {
			if err := checkKnown(key, known); err != nil {
				return err
			}
		}
		c.ws()
		if c.i >= len(c.b) || c.b[c.i] != ':' {
			return c.errf("want ':' after a key")
		}
		c.i++
		c.ws()
		sub := schemaNone
		if schema == schemaRecord {
			switch key {
			case "outputs":
				sub = schemaOutputs
			case "crc":
				c.crc = true
			}
		}
		if err := c.value(depth+1, sub); err != nil {
			return err
		}
		c.ws()
		if c.i >= len(c.b) {
			return c.errf("unexpected end in an object")
		}
		switch c.b[c.i] {
		case ',':
			c.i++
		case '}':
			c.i++
			return nil
		default:
			return c.errf("unexpected %q in an object", c.b[c.i])
		}
	}
}
