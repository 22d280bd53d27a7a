package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/runstate/runstate/cli"
)

// FuzzConninfoNeverShown: a libpq key=value connection string that pgx
// reads a password from, given as DIR to a read command or to ls, is
// never shown with that password (the command takes postgres:// addresses
// only; it used to echo such a string whole, then a masking of it leaked
// the password through a quoted value, a \v, an escaped space). Strings
// in URL form are FuzzSplitRun's (one that begins with '-' is read as a
// flag, whose error used to quote it); of the password, the runs of letters
// and digits of 6 bytes or more that the string holds once are looked
// for (a shorter one, or text held twice, may be in a message by
// chance).
func FuzzConninfoNeverShown(f *testing.F) {
	for _, s := range []string{
		"host=db dbname=agents user=agent password=Sekr1t99 run=billing",
		"host=db password = 'Wrong Sekr1t99\\'x' dbname=agents",
		"host='db'password=Sekr1t99",
		"host=db\rpassword=Sekr1t99",
		"password\v=Sekr1t99",
		"host=db password=ab\\ Sekr1t99",
		"dbname='postgres://u:Sekr1t99@h/db' password=Sekr1t99",
		"sslpassword=Sekr1t99 sslkey=/k password=Sekr1t99",
		"password=Sekr1t99",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.Contains(s, "://") || strings.ContainsRune(s, 0) {
			return
		}
		if _, err := os.Lstat(s); err == nil {
			return // a path that exists is a directory to read
		}
		cfg, err := pgconn.ParseConfig(s)
		if err != nil || cfg.Password == "" || cfg.Password == os.Getenv("PGPASSWORD") {
			return
		}
		// The password's runs of letters and digits of 6 bytes or more
		// that the string holds once: its text there, whatever quoting
		// or escapes surround them.
		var secrets []string
		for _, p := range strings.FieldsFunc(cfg.Password, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
			if len(p) >= 6 && strings.Count(s, p) == 1 {
				secrets = append(secrets, p)
			}
		}
		run := func(cmd, arg string) string {
			var out, errb bytes.Buffer
			cli.Run([]string{cmd, arg}, &out, &errb, options())
			return out.String() + errb.String()
		}
		for _, cmd := range []string{"status", "ls", "verify"} {
			got := run(cmd, s)
			for _, p := range secrets {
				// The command's own words may hold the text ("postgres"):
				// a leak is the text more often than with it replaced.
				base := run(cmd, strings.Replace(s, p, strings.Repeat("Q", len(p)), 1))
				if strings.Count(got, p) > strings.Count(base, p) {
					t.Fatalf("runstate %s %q shows the password %q: %s", cmd, s, cfg.Password, got)
				}
			}
		}
	})
}
