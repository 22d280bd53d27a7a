package runstate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// call runs fn on a goroutine of its own and returns its error; a panic
// or a call that does not return within a minute fails the test.
func call(t *testing.T, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("panic: %v", p)
			}
		}()
		done <- fn()
	}()
	select {
	case err := <-done:
		if err != nil && strings.HasPrefix(err.Error(), "panic: ") {
			t.Fatalf("%s panicked: %v", what, err)
		}
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s hangs", what)
		return nil
	}
}

// assertReadsBack checks that the run in dir is what its writer
// acknowledged: Verify finds no problem, and a full replay (Open without
// the manifest) works.
func assertReadsBack(t *testing.T, dir string) {
	t.Helper()
	rep, err := runstate.Verify(dir)
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%v", rep.Problems)
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	r, err := runstate.Open(dir, testOptions())
	require.NoError(t, err, "a full replay")
	require.NoError(t, r.Close())
}

// What the writer acknowledges, the reader reads back: free text longer
// than the limit is cut, with a marker, and still acknowledged; a JSON
// value (receipt, request, plan, input set, identity) too large for a
// ledger line, or nested too deep, is refused with ErrInvalid before
// anything is recorded. Either way every reader accepts the ledger after.
func TestAcknowledgedRecordsReadBack(t *testing.T) {
	ctx := context.Background()
	r, dir := newTestRun(t)
	huge := strings.Repeat("é", 17<<20/2) // 17 MiB of text, two bytes a character

	// Free text: cut, acknowledged.
	err := call(t, "Do", func() error {
		return r.Do(ctx, "fails", func(context.Context, *runstate.Stage) error { return errors.New(huge) })
	})
	require.Error(t, err)
	assert.Len(t, err.Error(), len(huge), "the caller gets the whole error")
	require.NoError(t, call(t, "Skip", func() error { return r.Skip(ctx, "skipped", huge) }))
	require.NoError(t, call(t, "Invalidate", func() error { return r.Invalidate(ctx, "skipped", huge) }))
	err = r.Do(ctx, "review", func(_ context.Context, st *runstate.Stage) error { return st.Await(huge) })
	require.ErrorIs(t, err, runstate.ErrNeedsPerson, "the await is acknowledged")
	require.NoError(t, call(t, "Approve", func() error { return r.Approve(ctx, "review", huge, huge) }))

	s, err := r.Status()
	require.NoError(t, err)
	fails, _ := s.Stage("fails")
	text := fails.Error
	assert.LessOrEqual(t, len(text), 64<<10)
	assert.True(t, utf8.ValidString(text), "cut at a character boundary")
	kept, _, found := strings.Cut(text, "… [cut: ")
	require.True(t, found, "the cut is marked: %.100q", text)
	assert.True(t, strings.HasPrefix(huge, kept))
	assert.Equal(t, kept+fmt.Sprintf("… [cut: %d bytes]", len(huge)-len(kept)), text)

	// JSON values: refused, nothing recorded.
	bigReceipt := json.RawMessage(`"` + strings.Repeat("x", 17<<20) + `"`)
	deep := json.RawMessage(strings.Repeat("[", 300) + strings.Repeat("]", 300))
	twice := json.RawMessage(`{"id":1,"id":2}`)
	_, err = r.Effect(ctx, "pending", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) { return nil, runstate.ErrPending }})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	before := readLedgerBytes(t, dir)
	for name, receipt := range map[string]json.RawMessage{"17 MiB": bigReceipt, "nested 300 deep": deep, "a key twice": twice} {
		err := call(t, "Resolve", func() error {
			return r.Resolve(ctx, "pending", runstate.Resolution{Sent: true, Receipt: receipt, By: "ann"})
		})
		assert.ErrorIs(t, err, runstate.ErrInvalid, name)
		assert.Contains(t, err.Error(), "receipt", name)
		var calls int
		_, err = r.Effect(ctx, "req-"+name, runstate.Effect{Request: receipt, Do: func(context.Context, string) (json.RawMessage, error) {
			calls++
			return nil, nil
		}})
		assert.ErrorIs(t, err, runstate.ErrInvalid, name)
		assert.Zero(t, calls, "%s: Do is not called", name)
	}
	err = r.Plan(ctx, func() []string {
		names := make([]string, 1_500_000)
		for i := range names {
			names[i] = fmt.Sprintf("stage-%07d", i)
		}
		return names
	}()...)
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "1500000 stages")
	assert.Contains(t, err.Error(), fmt.Sprint(4<<20), "the error names the limit")
	_, err = r.Begin(ctx, "many-inputs", runstate.Value(strings.Repeat("n", 5<<20), 1))
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = r.Effect(ctx, strings.Repeat("k", 5000), runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) { return nil, nil }})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Equal(t, before, readLedgerBytes(t, dir), "nothing was recorded for a refused value")

	// A receipt Do returns that is too large: the effect happened, so it
	// is recorded as unconfirmed (a person decides), with ErrInvalid.
	_, err = r.Effect(ctx, "big", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) { return bigReceipt, nil }})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assert.ErrorIs(t, err, runstate.ErrUnconfirmed)
	s, err = r.Status()
	require.NoError(t, err)
	states := map[string]string{}
	for _, e := range s.Effects {
		states[e.Key] = e.State
	}
	assert.Equal(t, runstate.EffectUnconfirmed, states["big"])
	require.NoError(t, r.Close())

	assertReadsBack(t, dir)

	// The run identity, recorded in every create and open record.
	_, err = runstate.Open(t.TempDir(), &runstate.Options{Request: strings.Repeat("r", 5<<20), NoSync: true})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = runstate.Open(dir, &runstate.Options{Environment: map[string]string{"big": strings.Repeat("e", 5<<20)}, NoSync: true})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	assertReadsBack(t, dir)
}

// A bad value never panics the commit path: an Effect whose Do returns a
// receipt that is not JSON (a plain-text HTTP body), a Check that does, or
// a Resolve given one, is ErrInvalid naming the key; the Run goes on
// working (Close too), and a later session reads the ledger.
func TestBadReceiptNeverPanicsTheCommitPath(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := runstate.Open(dir, testOptions()) // no Close in a cleanup: on a wedged Run it would hang
	require.NoError(t, err)
	plain := json.RawMessage("OK")
	err = call(t, "Effect", func() error {
		_, err := r.Effect(ctx, "mail", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) { return plain, nil }})
		return err
	})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.ErrorIs(t, err, runstate.ErrUnconfirmed, "it happened: the outcome is for a person (or Check) to settle")
	assert.Contains(t, err.Error(), "effect mail")
	assert.Contains(t, err.Error(), "receipt")

	require.NoError(t, call(t, "Plan after a bad receipt", func() error { return r.Plan(ctx, "a") }))
	require.NoError(t, call(t, "Do after a bad receipt", func() error { return r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }) }))
	require.NoError(t, call(t, "Close", r.Close))

	// The next session: Check returns the same body.
	r, err = runstate.Open(dir, testOptions())
	require.NoError(t, err)
	check := runstate.Effect{
		Do:    func(context.Context, string) (json.RawMessage, error) { t.Error("Do called again"); return nil, nil },
		Check: func(context.Context, string) (json.RawMessage, bool, error) { return plain, true, nil },
	}
	err = call(t, "Effect with Check", func() error { _, err := r.Effect(ctx, "mail", check); return err })
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.ErrorIs(t, err, runstate.ErrUnconfirmed)
	assert.Contains(t, err.Error(), "effect mail")

	err = call(t, "Resolve", func() error {
		return r.Resolve(ctx, "mail", runstate.Resolution{Sent: true, Receipt: plain, By: "ann"})
	})
	require.ErrorIs(t, err, runstate.ErrInvalid)
	assert.Contains(t, err.Error(), "effect mail")
	require.NoError(t, r.Resolve(ctx, "mail", runstate.Resolution{Sent: true, Receipt: json.RawMessage(`"OK"`), By: "ann"}))
	got, err := r.Effect(ctx, "mail", check)
	require.NoError(t, err)
	assert.JSONEq(t, `"OK"`, string(got))
	require.NoError(t, call(t, "Close", r.Close))
	assertReadsBack(t, dir)
}

// TestIdentityMustBeUTF8: Open refuses a Request, Revision or Environment
// key or value that is not valid UTF-8, saying which, and writes nothing.
// JSON would record U+FFFD in place of the bad bytes, so a run created
// with such a Request never matched it again (ErrMismatch on every Open).
func TestIdentityMustBeUTF8(t *testing.T) {
	bad := "fix the \xff parser"
	for _, c := range []struct {
		name string
		opts runstate.Options
	}{
		{"Options.Request", runstate.Options{Request: bad}},
		{"Options.Revision", runstate.Options{Request: testRequest, Revision: bad}},
		{"Options.Environment", runstate.Options{Request: testRequest, Environment: map[string]string{"host": bad}}},
		{"Options.Environment", runstate.Options{Request: testRequest, Environment: map[string]string{bad: "x"}}},
	} {
		dir := t.TempDir()
		c.opts.NoSync = true
		r, err := runstate.Open(dir, &c.opts)
		if !assert.Error(t, err, c.name) {
			r.Close()
			continue
		}
		assert.ErrorIs(t, err, runstate.ErrInvalid, c.name)
		assert.Contains(t, err.Error(), c.name+" is not valid UTF-8", c.name)
		_, err = os.Stat(filepath.Join(dir, "logs", "ledger.jsonl"))
		assert.True(t, os.IsNotExist(err), "%s: nothing written", c.name)
	}
}
