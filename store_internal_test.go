package runstate

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
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

// addrStore is a Store that names its own places (Addresser).
type addrStore struct {
	Store
	addr string
	look []string
}

func (a addrStore) Address() string  { return a.addr }
func (a addrStore) LookAt() []string { return a.look }

// TestHandoffNamesAStoreAddressAsItIs: the handoff of a run in a store
// named by an address (pgstore's postgres://...) names it as given, not
// made into a path, and sends the reader to the store's places and the
// commands, not to files that store does not have.
func TestHandoffNamesAStoreAddressAsItIs(t *testing.T) {
	addr := "postgres://u@127.0.0.1:5432/db?run=billing&schema=s"
	assert.Equal(t, escape.Arg(addr), dirArg(addr))
	s := newState()
	text := s.nextStepsIn(placeOf(addrStore{addr: addr, look: []string{"table s.records, run billing"}}, t.TempDir()))
	assert.Contains(t, text, "runstate status "+escape.Arg(addr))
	assert.NotContains(t, text, "logs/ledger.jsonl")
	assert.True(t, strings.Contains(s.nextSteps(dirArg(t.TempDir())), "logs/ledger.jsonl"), "a run directory's handoff names its files")
}

// TestHandoffLookAtLinesComeFromTheStore: a store that names its own
// places (Addresser) gives the handoff's "look at:" lines, escaped, then
// the commands on its address; one without an address (memory) gives
// its lines and no command; a run directory's page ends as it always did.
func TestHandoffLookAtLinesComeFromTheStore(t *testing.T) {
	dir := t.TempDir()
	addr := "postgres://u@db:5432/agents?run=billing"
	s := newState()
	text := s.nextStepsIn(placeOf(addrStore{addr: addr, look: []string{"table runstate.records, run billing", "a working dir's view\x1b[31m"}}, dir))
	want := "look at:  table runstate.records, run billing\n" +
		"          a working dir's view\\x1b[31m\n" +
		"          runstate status " + escape.Arg(addr) + "; runstate log " + escape.Arg(addr) + "\n"
	assert.True(t, strings.HasSuffix(text, want), "the store's lines, escaped, then its commands:\n%s", text)
	assert.NotContains(t, text, "ledger.jsonl")
	assert.NotContains(t, text, "manifest.json")

	text = s.nextStepsIn(placeOf(addrStore{look: []string{"memory store 1: the records, in this process only"}}, dir))
	assert.True(t, strings.HasSuffix(text, "\nlook at:  memory store 1: the records, in this process only\n"), text)
	assert.NotContains(t, text, "runstate status")

	fileText := s.nextStepsIn(placeOf(newDirStore(dir, Options{}), dir))
	assert.Equal(t, s.nextSteps(dirArg(dir)), fileText)
	assert.True(t, strings.HasSuffix(fileText, "\n\nlook at:  logs/ledger.jsonl (the source of truth, one JSON record a line)\n"+
		"          manifest.json (stages, artifacts with hashes, effects)\n"+
		"          runstate status "+dirArg(dir)+"; runstate log "+dirArg(dir)+"\n"), fileText)
}

// TestReadFileLimit: readFile reads a file of limit bytes, and refuses a
// longer one with an error that names it and the limit, without reading
// it whole.
func TestReadFileLimit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "manifest.json")
	require.NoError(t, os.WriteFile(p, []byte("0123456789"), 0o644))
	data, err := readFile(osFS{}, p, 10)
	require.NoError(t, err)
	assert.Equal(t, "0123456789", string(data))
	_, err = readFile(osFS{}, p, 9)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrInvalid)
	assert.Contains(t, err.Error(), p)
	assert.Contains(t, err.Error(), "more than the 9 bytes")
}

// TestSaveTornStreams: saveTorn copies a torn tail aside whole without
// holding it in memory (a torn last line is not held to the line limit),
// and fails, naming the ledger, when the ledger ends before the bytes it
// was asked to save.
func TestSaveTornStreams(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.FromSlash(tmpDir)), 0o755))
	lp := filepath.Join(dir, filepath.FromSlash(ledgerFile))
	const head, n = 100, 32 << 20
	data := make([]byte, head+n)
	for i := range data {
		data[i] = byte(i)
	}
	require.NoError(t, os.WriteFile(lp, data, 0o644))
	f, err := os.Open(lp)
	require.NoError(t, err)
	defer f.Close()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	aside, err := saveTorn(osFS{}, dir, "t", f, head, head+n, false)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "bytes allocated to save %d", n)
	saved, err := os.ReadFile(aside)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data[head:], saved), "the torn bytes are saved as they were")

	_, err = saveTorn(osFS{}, dir, "t", f, head, head+n+1, false)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Contains(t, err.Error(), lp)
}
