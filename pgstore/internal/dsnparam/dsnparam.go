// Package dsnparam takes one parameter out of a postgres:// address's
// query, as pgx reads the query: pgstore's schema=NAME and the runstate
// command's run=NAME, which are not settings for the server.
package dsnparam

import (
	"errors"
	"net/url"
	"strings"
)

// ErrTwice: the query gives the key more than once.
var ErrTwice = errors.New("the parameter is given twice")

// Cut removes key from query (the part after '?') and returns the query
// left, in its order and escaping, and key's value, unescaped. A key is
// compared unescaped, since pgx unescapes keys too (r%75n=x is run=x to
// it); one whose escape is broken is kept, as pgx then refuses the whole
// query. Empty pairs (a doubled '&') are dropped. found is false when key
// is not there; err is ErrTwice for a key given twice, or the unescape
// error of its value. Safe for concurrent use.
func Cut(query, key string) (rest, value string, found bool, err error) {
	var keep []string
	for kv := range strings.SplitSeq(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if uk, err := url.QueryUnescape(k); err != nil || uk != key {
			if kv != "" {
				keep = append(keep, kv)
			}
			continue
		}
		if found {
			return "", "", true, ErrTwice
		}
		found = true
		if value, err = url.QueryUnescape(v); err != nil {
			return "", "", true, err
		}
	}
	return strings.Join(keep, "&"), value, found, nil
}
