package main

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzSplitRun: whatever address an operator or a script gives, splitRun
// does not panic; what it accepts names a run, and leaves in the DSN no
// parameter that pgx would read as one more setting named run (a key
// "run" in any escaping); a run parameter it is given comes out as the
// name that was escaped into it; and no error shows the address's
// password: where the password cannot move the address's other parts
// (no '@', '/' or '?' in it), the error is the same whatever the password
// is; else it does not hold the password, unless the address has the
// password's text in another place too (leaksPassword).
func FuzzSplitRun(f *testing.F) {
	f.Add("sslmode=disable", "billing-1", "schema=s", "Zq7Wk42")
	f.Add("", "a&b=c#d", "", "se/cret9")
	f.Add("r%75n=x", "50% + 1", "run", "pw12345")
	f.Add("r%75n=x", "a", "", "pw12345")
	f.Add("", "a", "%72un=b", "pw12345")
	f.Add("password=abcdef", "%zz", "&&=", "abcdef")
	f.Fuzz(func(t *testing.T, pre, name, post, pw string) {
		for _, addr := range []string{
			"postgres://u:" + pw + "@h:5432/db?" + pre + "&" + post,
			"postgres://u:" + pw + "@h/db?" + pre + "&run=" + name + "&" + post,
		} {
			dsn, run, err := splitRun(addr)
			if err != nil {
				if leaksPassword(addr, pw, err) {
					t.Fatalf("%q: the error shows the password: %v", addr, err)
				}
				continue
			}
			if run == "" {
				t.Fatalf("%q: accepted with no run", addr)
			}
			if _, query, _ := strings.Cut(dsn, "?"); namesRun(query) {
				t.Fatalf("%q: the DSN %q keeps a run parameter", addr, dsn)
			}
		}
		if namesRun(pre) || namesRun(post) {
			return // a run of its own, or two
		}
		addr := "postgres://u@h/db?" + pre + "&run=" + url.QueryEscape(name) + "&" + post
		_, run, err := splitRun(addr)
		if name == "" {
			if err == nil {
				t.Fatalf("%q: an empty run accepted", addr)
			}
			return
		}
		if err != nil || run != name {
			t.Fatalf("%q: run %q (%v), want %q", addr, run, err, name)
		}
	})
}

// namesRun reports whether a query has a key that is, or unescapes to,
// "run".
func namesRun(query string) bool {
	for kv := range strings.SplitSeq(query, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if uk, err := url.QueryUnescape(k); k == "run" || (err == nil && uk == "run") {
			return true
		}
	}
	return false
}

// leaksPassword reports whether err, splitRun's error for addr (which
// begins "postgres://u:" + pw + "@"), shows the password pw. A password
// without '@', '/' or '?' stays in its place whatever it is, so the error
// must not depend on it: it is compared with the error for the address
// without a password. Another password is looked for in the error, if it
// is 6 bytes or more and its text is nowhere else in the address (the
// address's query is shown: FuzzSplitRun found the password "?00000"
// there, in "db?00000000%000", the '?' the address's own).
func leaksPassword(addr, pw string, err error) bool {
	const head = "postgres://u:"
	if !strings.ContainsAny(pw, "@/?") {
		_, _, err2 := splitRun(head + strings.TrimPrefix(addr, head+pw))
		return err2 == nil || err2.Error() != err.Error()
	}
	if len(pw) < 6 {
		return false
	}
	for i := 0; i+len(pw) <= len(addr); i++ {
		if i != len(head) && addr[i:i+len(pw)] == pw {
			return false // the address shows it elsewhere: not a leak to tell
		}
	}
	return strings.Contains(err.Error(), pw)
}
