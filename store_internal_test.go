package runstate

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/internal/escape"
)

// TestClosedSessionIsGoneWithoutAskingTheStore: a session whose close
// record the state holds is gone, whatever the store would answer (here
// its lock file is still held: a store's lease may be released after the
// close record, as a database's is). Its running stage is taken over, not
// ErrBusy.
func TestClosedSessionIsGoneWithoutAskingTheStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := Open(dir, &Options{Request: "closed", NoSync: true})
	require.NoError(t, err)
	defer a.crash()
	_, err = a.Begin(ctx, "x")
	require.NoError(t, err)
	b, err := Open(dir, &Options{NoSync: true})
	require.NoError(t, err)
	defer b.Close()
	// A's close record, as a store would hold it before A's lease ends.
	_, err = b.commit(true, func(*state) ([]*Record, error) {
		return []*Record{{Ev: evClose, Session: a.Session(), Data: []byte(`{}`)}}, nil
	})
	require.NoError(t, err)
	st, err := b.Begin(ctx, "x")
	require.NoError(t, err, "the closed session's stage is begun again")
	assert.Equal(t, 2, st.Attempt())
}

// TestHandoffNamesAStoreAddressAsItIs: the handoff of a run in a store
// named by an address (pgstore's postgres://...) names it as given, not
// made into a path, and sends the reader to the commands, not to files
// that store does not have.
func TestHandoffNamesAStoreAddressAsItIs(t *testing.T) {
	addr := "postgres://u@127.0.0.1:5432/db?run=billing&schema=s"
	assert.Equal(t, escape.Arg(addr), dirArg(addr))
	s := newState()
	text := s.nextSteps(dirArg(addr))
	assert.Contains(t, text, "runstate status "+escape.Arg(addr))
	assert.NotContains(t, text, "logs/ledger.jsonl")
	assert.True(t, strings.Contains(s.nextSteps(dirArg(t.TempDir())), "logs/ledger.jsonl"), "a run directory's handoff names its files")
}
