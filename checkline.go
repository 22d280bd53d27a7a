package runstate

// DecodeLine decodes one ledger line, its bytes without the '\n', as the
// run's own reader does: one JSON record with the exact field names and
// no key given twice, a seq and an ev, and, where the line has a crc
// field, a checksum that matches its bytes. crc reports whether it has
// one: in a ledger, every line after one with a crc must have one. It
// does not check the hash chain (that seq follows the line before's and
// prev is its hash): the caller, which has the line before, does. The
// error says what is wrong with the line; the caller adds where it is.
// Tools that read a ledger line by line (runstate log -follow, export)
// use it so that they accept exactly what Open and Verify accept. It
// reads and writes nothing and is safe for concurrent use.
func DecodeLine(line []byte) (rec *Record, crc bool, err error) {
	var d decoder
	r := new(Record)
	if err := d.parse(line, "", r); err != nil {
		return nil, false, err
	}
	return r, d.crc, nil
}

// CheckKey reports whether key is a valid effect key (Run.Effect,
// Run.Resolve): not empty, valid UTF-8 of at most 4 KiB, no control
// character. The error wraps ErrInvalid and quotes the key. Tools that
// take a key from a person check it with this before opening the run. It
// reads and writes nothing and is safe for concurrent use.
func CheckKey(key string) error { return checkKey(key) }
