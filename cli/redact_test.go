package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestRedactHidesEveryPassword: an address's password is in no message,
// wherever it is: the userinfo (escaped or not, with characters net/url
// refuses or that move it out of the userinfo), or a password or
// sslpassword parameter (a key spelled with escapes too). A valid address
// without one comes out unchanged.
func TestRedactHidesEveryPassword(t *testing.T) {
	cases := []struct{ addr, want string }{
		{"postgres://u:secret@h:5432/db?run=x", "postgres://u:xxxxx@h:5432/db?run=x"},
		{"postgres://u:se%zzcret@h/db?run=x", "postgres://u:xxxxx@h/db?run=x"}, // not a valid escape
		{"postgres://u:se cret@h/db?run=x", "postgres://u:xxxxx@h/db?run=x"},   // a space
		{"postgres://u:se/cret@h/db?run=x", "postgres://u:xxxxx@h/db?run=x"},   // '/' ends the userinfo for pgx
		{"postgres://u:se/c@ret@h/db?run=x", "postgres://u:xxxxx@h/db?run=x"},  // and an '@'
		{"postgres://u:se@cret@h/db?run=x", "postgres://u:xxxxx@h/db?run=x"},   // an '@'
		{"postgres://u@h/db?password=secret&run=x", "postgres://u@h/db?password=xxxxx&run=x"},
		{"postgres://u@h/db?run=x&sslpassword=secret", "postgres://u@h/db?run=x&sslpassword=xxxxx"},
		{"postgres://u@h/db?pass%77ord=secret&run=x", "postgres://u@h/db?pass%77ord=xxxxx&run=x"},
		{"postgresql://u@h:5432/db?sslmode=disable&application_name=a@b&run=x", "postgresql://u@h:5432/db?sslmode=disable&application_name=a@b&run=x"},
		{"postgres:///db?host=/run/postgresql&run=x", "postgres:///db?host=/run/postgresql&run=x"},
		{"postgres://u@db/agents?run=b", "postgres://u@db/agents?run=b"},
		{"postgres://u:p@db", "postgres://u:xxxxx@db"},
		{"runs/billing", "runs/billing"}, // a run directory
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Redact(c.addr), "%s", c.addr)
	}
}

// FuzzRedact: a password of at least four bytes put in an address's
// userinfo or in its password parameter is not in Redact's result,
// whatever the bytes around it.
func FuzzRedact(f *testing.F) {
	f.Add("u", "secret", "h:5432", "sslmode=disable", false)
	f.Add("u", "se/c@ret", "h", "run=x", false)
	f.Add("agent", "p%zz w?#", "db.example", "application_name=a@b", false)
	f.Add("u", "secret", "h", "run=%zz", true)
	f.Fuzz(func(t *testing.T, user, pw, host, query string, param bool) {
		if len(pw) < 4 || strings.ContainsRune(pw, 0) || strings.ContainsAny(user, ":@/?#") || strings.ContainsAny(host, "@") || strings.Contains(query, "@") {
			return
		}
		var addr string
		if param {
			if strings.ContainsAny(pw, "&#") { // would end the parameter
				return
			}
			addr = "postgres://" + user + "@" + host + "/db?" + query + "&password=" + pw
		} else {
			addr = "postgres://" + user + ":" + pw + "@" + host + "/db?" + query
		}
		if strings.Contains(strings.Replace(addr, pw, "", 1), pw) || strings.Contains("xxxxx", pw) {
			return // pw is elsewhere in the address too
		}
		got := Redact(addr)
		shown := strings.Contains(got, pw)
		if shown && (pw[0] == 'x' || pw[len(pw)-1] == 'x') {
			// A password that begins or ends in x's can meet the mask
			// without being shown ("xxx@" in "xxxxx@"): read the mask as
			// a character of its own.
			shown = strings.Contains(strings.ReplaceAll(got, "xxxxx", "\x00"), pw)
		}
		if shown {
			t.Fatalf("Redact(%q) = %q: the password is there", addr, got)
		}
	})
}
