package dsnparam

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCut(t *testing.T) {
	for _, c := range []struct {
		query, key, rest, value string
		found                   bool
		err                     error
	}{
		{"run=a", "run", "", "a", true, nil},
		{"sslmode=disable&run=a%20b&x=1", "run", "sslmode=disable&x=1", "a b", true, nil},
		{"sslmode=disable&&x=1", "run", "sslmode=disable&x=1", "", false, nil},
		{"r%75n=a&x=%zz", "run", "x=%zz", "a", true, nil},     // the key unescaped; another's broken value kept
		{"r%zzn=a&run=b", "run", "r%zzn=a", "b", true, nil},   // a broken key kept
		{"run=a&schema=s", "schema", "run=a", "s", true, nil}, // any key
		{"run=a&%72un=b", "run", "", "", true, ErrTwice},      // twice, one of them escaped
		{"", "run", "", "", false, nil},                       // no query
		{"runner=a&run", "run", "runner=a", "", true, nil},    // a key with no '=': empty
	} {
		rest, value, found, err := Cut(c.query, c.key)
		if c.err != nil {
			assert.ErrorIs(t, err, c.err, c.query)
			continue
		}
		assert.NoError(t, err, c.query)
		assert.Equal(t, []any{c.rest, c.value, c.found}, []any{rest, value, found}, c.query)
	}
	_, _, _, err := Cut("run=%zz", "run")
	assert.Error(t, err, "a broken escape in the value")
}
