package runstate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
)

// Helpers of the issue-3 tests (effect_test.go, policy_test.go,
// flow_test.go, session_test.go, metrics_test.go) carry an i3 prefix so
// they do not collide with the other test files of the package.

const i3Request = "issue 3: effects, policy, flows"

func i3Options() *runstate.Options {
	return &runstate.Options{Request: i3Request, NoSync: true}
}

// i3Open opens dir and closes the run when the test ends.
func i3Open(t testing.TB, dir string, opts *runstate.Options) *runstate.Run {
	t.Helper()
	if opts == nil {
		opts = i3Options()
	}
	r, err := runstate.Open(dir, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// i3Records reads the whole ledger of dir, checking its chain.
func i3Records(t testing.TB, dir string) []*runstate.Record {
	t.Helper()
	var recs []*runstate.Record
	require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error {
		recs = append(recs, r)
		return nil
	}))
	return recs
}

// i3Evs lists the events of the records about one stage or effect key.
func i3Evs(recs []*runstate.Record, name string) []string {
	var out []string
	for _, r := range recs {
		if r.Stage == name || r.Key == name {
			out = append(out, r.Ev)
		}
	}
	return out
}

// i3Effect returns the status of one effect.
func i3Effect(t testing.TB, r *runstate.Run, key string) runstate.EffectStatus {
	t.Helper()
	st, err := r.Status()
	require.NoError(t, err)
	for _, e := range st.Effects {
		if e.Key == key {
			return e
		}
	}
	t.Fatalf("effect %s not in status", key)
	return runstate.EffectStatus{}
}

// receiver is a fake receiving system that honours idempotency keys, as
// the HTTP APIs Effect is made for do (Stripe, a ticket tracker): POST
// /send with an Idempotency-Key creates one message per key; GET
// /send?key=K says whether it exists.
type receiver struct {
	srv *httptest.Server

	mu         sync.Mutex
	byKey      map[string]string // idempotency key → message id
	posts      []string          // the key of every POST, in order
	checks     int               // GETs answered
	checkFails bool              // GET answers 500
	accept     bool              // POST answers 202: accepted, visible only after release
	held       map[string]string // accepted, not yet visible
	next       int
}

func newReceiver(t testing.TB) *receiver {
	rc := &receiver{byKey: map[string]string{}, held: map[string]string{}}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, req *http.Request) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	switch req.Method {
	case http.MethodPost:
		key := req.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, "no Idempotency-Key", http.StatusBadRequest)
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		rc.posts = append(rc.posts, key)
		if id, ok := rc.byKey[key]; ok {
			fmt.Fprintf(w, `{"id":%q,"replayed":true}`, id)
			return
		}
		if id, ok := rc.held[key]; ok {
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, `{"id":%q}`, id)
			return
		}
		rc.next++
		id := fmt.Sprintf("m-%d", rc.next)
		if rc.accept {
			rc.held[key] = id
			w.WriteHeader(http.StatusAccepted)
			fmt.Fprintf(w, `{"id":%q}`, id)
			return
		}
		rc.byKey[key] = id
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	case http.MethodGet:
		rc.checks++
		if rc.checkFails {
			http.Error(w, "receiver is down", http.StatusInternalServerError)
			return
		}
		id, ok := rc.byKey[req.URL.Query().Get("key")]
		if !ok {
			http.NotFound(w, req)
			return
		}
		fmt.Fprintf(w, `{"id":%q}`, id)
	}
}

// release makes the accepted messages visible.
func (rc *receiver) release() {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for k, id := range rc.held {
		rc.byKey[k] = id
		delete(rc.held, k)
	}
}

// forget drops key, as if the POST never landed.
func (rc *receiver) forget(key string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	delete(rc.byKey, key)
}

func (rc *receiver) set(f func(rc *receiver)) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	f(rc)
}

func (rc *receiver) stats() (posts []string, messages, checks int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]string(nil), rc.posts...), len(rc.byKey), rc.checks
}

// sendTo is an Effect.Do that POSTs to the receiver at url.
func sendTo(url string) func(ctx context.Context, key string) (json.RawMessage, error) {
	return func(ctx context.Context, key string) (json.RawMessage, error) {
		return postMessage(ctx, url, key)
	}
}

func postMessage(ctx context.Context, url, key string) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/send", strings.NewReader(`{"text":"hello"}`))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	switch resp.StatusCode {
	case http.StatusOK, http.StatusCreated:
		return json.RawMessage(body), nil
	case http.StatusAccepted:
		return nil, fmt.Errorf("%w: queued as %s", runstate.ErrPending, body)
	}
	return nil, fmt.Errorf("POST /send: %s", resp.Status)
}

// checkAt is an Effect.Check that asks the receiver at url.
func checkAt(url string) func(ctx context.Context, key string) (json.RawMessage, bool, error) {
	return func(ctx context.Context, key string) (json.RawMessage, bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/send?key="+key, nil)
		if err != nil {
			return nil, false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, false, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		switch resp.StatusCode {
		case http.StatusOK:
			return json.RawMessage(body), true, nil
		case http.StatusNotFound:
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("GET /send: %s", resp.Status)
	}
}

func TestEffectSendsOnceAndReturnsStoredReceipt(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rc := newReceiver(t)
	r := i3Open(t, dir, nil)

	var keys []string
	var ledgerAtDo []*runstate.Record
	e := runstate.Effect{
		Request: map[string]string{"title": "flaky test"},
		Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			keys = append(keys, key)
			ledgerAtDo = i3Records(t, dir) // what is on disk when Do runs
			return postMessage(ctx, rc.srv.URL, key)
		},
		Check: checkAt(rc.srv.URL),
	}
	got, err := r.Effect(ctx, "ticket:1", e)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"m-1"}`, string(got))
	require.Equal(t, []string{r.ID() + ":ticket:1"}, keys, "Do gets the full key <run-id>:<key>")

	// The intent, with the request, was on disk before Do was called.
	last := ledgerAtDo[len(ledgerAtDo)-1]
	assert.Equal(t, "intent", last.Ev)
	assert.Equal(t, "ticket:1", last.Key)
	assert.JSONEq(t, `{"title":"flaky test"}`, string(last.Data))

	// Again in this session, and in a later one: the stored receipt, no Do.
	got, err = r.Effect(ctx, "ticket:1", e)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"m-1"}`, string(got))
	require.NoError(t, r.Close())
	r = i3Open(t, dir, nil)
	got, err = r.Effect(ctx, "ticket:1", e)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"m-1"}`, string(got))

	assert.Len(t, keys, 1, "Do called once over two sessions")
	posts, messages, checks := rc.stats()
	assert.Len(t, posts, 1)
	assert.Equal(t, 1, messages)
	assert.Zero(t, checks, "a confirmed key needs no Check")
	recs := i3Records(t, dir)
	assert.Equal(t, []string{"intent", "confirm"}, i3Evs(recs, "ticket:1"))
	confirm := recs[len(recs)-1]
	for _, rec := range recs {
		if rec.Ev == "confirm" {
			confirm = rec
		}
	}
	assert.JSONEq(t, `{"id":"m-1"}`, string(confirm.Data), "the receipt is recorded with the confirm")
	es := i3Effect(t, r, "ticket:1")
	assert.Equal(t, runstate.EffectConfirmed, es.State)
	assert.Equal(t, 1, es.Intents)
}

func TestEffectRefusesAnotherRequestUnderTheSameKey(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	calls := 0
	do := func(context.Context, string) (json.RawMessage, error) {
		calls++
		return json.RawMessage(`{"id":"T-1"}`), nil
	}
	_, err := r.Effect(ctx, "ticket", runstate.Effect{Request: map[string]int{"amount": 10}, Do: do})
	require.NoError(t, err)

	before := len(i3Records(t, dir))
	_, err = r.Effect(ctx, "ticket", runstate.Effect{Request: map[string]int{"amount": 20}, Do: do})
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.Contains(t, err.Error(), "ticket")
	assert.Contains(t, err.Error(), "new key")
	assert.Equal(t, 1, calls)
	assert.Len(t, i3Records(t, dir), before, "a refusal writes nothing")

	// The same request (re-encoded from another value) is the same key.
	got, err := r.Effect(ctx, "ticket", runstate.Effect{Request: struct {
		Amount int `json:"amount"`
	}{10}, Do: do})
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"T-1"}`, string(got))

	// An unconfirmed key is refused too, before anyone asks Check.
	_, err = r.Effect(ctx, "mail", runstate.Effect{Request: "a", Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("connection reset")
	}})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	checked := false
	_, err = r.Effect(ctx, "mail", runstate.Effect{Request: "b", Do: do, Check: func(context.Context, string) (json.RawMessage, bool, error) {
		checked = true
		return nil, false, nil
	}})
	require.ErrorIs(t, err, runstate.ErrMismatch)
	assert.False(t, checked)
	assert.Equal(t, 1, calls)
}

func TestEffectPendingIsConfirmedByALaterCheck(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rc := newReceiver(t)
	rc.set(func(rc *receiver) { rc.accept = true })
	r := i3Open(t, dir, nil)

	var dos atomic.Int32
	e := runstate.Effect{
		Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			dos.Add(1)
			return postMessage(ctx, rc.srv.URL, key)
		},
		Check: checkAt(rc.srv.URL),
	}
	_, err := r.Effect(ctx, "deploy", e)
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	require.ErrorIs(t, err, runstate.ErrPending)
	es := i3Effect(t, r, "deploy")
	assert.Equal(t, runstate.EffectUnconfirmed, es.State)
	assert.True(t, es.Pending)

	// Not visible yet: still pending, and Do is not called again.
	n := len(i3Records(t, dir))
	_, err = r.Effect(ctx, "deploy", e)
	require.ErrorIs(t, err, runstate.ErrPending)
	assert.Len(t, i3Records(t, dir), n, "a Check that finds nothing yet writes nothing")

	// A Check that fails leaves it pending: a later not-found must not
	// send it again.
	rc.set(func(rc *receiver) { rc.checkFails = true })
	_, err = r.Effect(ctx, "deploy", e)
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	assert.True(t, i3Effect(t, r, "deploy").Pending)
	rc.set(func(rc *receiver) { rc.checkFails = false })
	require.NoError(t, r.Close())

	// A later session (replaying the ledger, no snapshot) still knows.
	require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json")))
	r = i3Open(t, dir, nil)
	assert.True(t, i3Effect(t, r, "deploy").Pending)
	_, err = r.Effect(ctx, "deploy", e)
	require.ErrorIs(t, err, runstate.ErrPending)
	assert.EqualValues(t, 1, dos.Load())

	rc.release()
	got, err := r.Effect(ctx, "deploy", e)
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":"m-1"}`, string(got))
	assert.EqualValues(t, 1, dos.Load(), "confirmed by Check, never sent twice")
	es = i3Effect(t, r, "deploy")
	assert.Equal(t, runstate.EffectConfirmed, es.State)
	assert.False(t, es.Pending)
	posts, messages, _ := rc.stats()
	assert.Len(t, posts, 1)
	assert.Equal(t, 1, messages)
	st, err := r.Status()
	require.NoError(t, err)
	assert.Zero(t, st.Metrics.EffectsUnconfirmed)
	assert.Zero(t, st.Metrics.EffectsDuplicated)
	assert.Equal(t, 1, st.Metrics.EffectsDeduplicated, "the confirm by Check counts as a send saved")
	assert.Equal(t, []string{"intent", "unconfirmed", "unconfirmed", "confirm"}, i3Evs(i3Records(t, dir), "deploy"))
}

func TestEffectFailedDoNeedsCheckOrPerson(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	var keys []string
	fail := true
	e := runstate.Effect{Do: func(_ context.Context, key string) (json.RawMessage, error) {
		keys = append(keys, key)
		if fail {
			return nil, errors.New("read tcp: connection reset by peer")
		}
		return json.RawMessage(`"sent"`), nil
	}}
	_, err := r.Effect(ctx, "mail", e)
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	assert.Contains(t, err.Error(), "connection reset by peer")
	assert.Contains(t, err.Error(), "it has no Check to ask whether it landed: resolve it with: runstate resolve", "not: call Effect again to ask its Check")

	// Without Check nobody can tell: each call says so, and Do is not
	// called again.
	_, err = r.Effect(ctx, "mail", e)
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	assert.Contains(t, err.Error(), "runstate resolve")
	assert.Len(t, keys, 1)
	st, err := r.Status()
	require.NoError(t, err)
	require.Len(t, st.Blockers, 1)
	assert.Equal(t, "unconfirmed", st.Blockers[0].Kind)
	assert.Equal(t, "mail", st.Blockers[0].Key)
	assert.Contains(t, st.Blockers[0].Action, "runstate resolve")
	assert.Equal(t, 1, st.Metrics.EffectsUnconfirmed)
	next, err := os.ReadFile(filepath.Join(dir, "logs", "next-steps.txt"))
	require.NoError(t, err)
	assert.Contains(t, string(next), "effect mail unconfirmed")

	// Resolve's arguments are checked.
	require.ErrorIs(t, r.Resolve(ctx, "mail", runstate.Resolution{}), runstate.ErrInvalid, "By is required")
	require.ErrorIs(t, r.Resolve(ctx, "nope", runstate.Resolution{By: "ann"}), runstate.ErrInvalid)

	// A person says it never went out: the next call sends it, same key.
	require.NoError(t, r.Resolve(ctx, "mail", runstate.Resolution{Sent: false, By: "ann", Note: "not in the outbox"}))
	fail = false
	got, err := r.Effect(ctx, "mail", e)
	require.NoError(t, err)
	assert.JSONEq(t, `"sent"`, string(got))
	assert.Equal(t, []string{r.ID() + ":mail", r.ID() + ":mail"}, keys)
	require.ErrorIs(t, r.Resolve(ctx, "mail", runstate.Resolution{By: "ann"}), runstate.ErrInvalid, "a confirmed effect is not resolved")

	recs := i3Records(t, dir)
	assert.Equal(t, []string{"intent", "unconfirmed", "unconfirmed", "resolve", "intent", "confirm"}, i3Evs(recs, "mail"))
	for _, rec := range recs {
		if rec.Ev == "resolve" {
			assert.Equal(t, "ann", rec.By)
			assert.Equal(t, "not in the outbox", rec.Note)
		}
	}
	st, err = r.Status()
	require.NoError(t, err)
	assert.Empty(t, st.Blockers)
	assert.Zero(t, st.Metrics.EffectsUnconfirmed)
	assert.Zero(t, st.Metrics.EffectsDuplicated)

	// With a Check, the error says the next call asks it.
	_, err = r.Effect(ctx, "ping", runstate.Effect{
		Do:    func(context.Context, string) (json.RawMessage, error) { return nil, errors.New("timeout") },
		Check: func(context.Context, string) (json.RawMessage, bool, error) { return nil, false, nil },
	})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)
	assert.Contains(t, err.Error(), "the next Effect call for the key asks its Check whether it landed, or resolve it with: runstate resolve")
}

func TestEffectDoPanicIsRecorded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	assert.PanicsWithValue(t, "boom", func() {
		_, _ = r.Effect(ctx, "page", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
			panic("boom")
		}})
	})
	es := i3Effect(t, r, "page")
	assert.Equal(t, runstate.EffectUnconfirmed, es.State, "not left as an intent this live session holds")
	assert.Contains(t, es.Error, "boom")

	// Check says it did not land: sent again, with the same key.
	got, err := r.Effect(ctx, "page", runstate.Effect{
		Do:    func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(`1`), nil },
		Check: func(context.Context, string) (json.RawMessage, bool, error) { return nil, false, nil },
	})
	require.NoError(t, err)
	assert.JSONEq(t, `1`, string(got))
}

// TestEffectDoGoexitIsRecorded: a Do that calls runtime.Goexit (t.Fatal
// in a test) is recorded as unconfirmed, as a panic is, and its goroutine
// ends as Goexit does; the next Effect asks Check. It re-panicked with
// nil, which crashed the test binary.
func TestEffectDoGoexitIsRecorded(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	done := make(chan bool, 1)
	go func() {
		defer func() { done <- true }()
		_, _ = r.Effect(ctx, "page", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
			runtime.Goexit()
			return nil, nil
		}})
		t.Error("Effect returned after Do called runtime.Goexit")
	}()
	<-done
	es := i3Effect(t, r, "page")
	assert.Equal(t, runstate.EffectUnconfirmed, es.State, "not left as an intent this live session holds")
	assert.Contains(t, es.Error, "Do called runtime.Goexit instead of returning")

	got, err := r.Effect(ctx, "page", runstate.Effect{
		Do:    func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(`2`), nil },
		Check: func(context.Context, string) (json.RawMessage, bool, error) { return nil, false, nil },
	})
	require.NoError(t, err)
	assert.JSONEq(t, `2`, string(got))
}

// TestEffectWhoseRunClosesDuringDo: when the Run is closed while an
// effect's Do runs (a deferred Close as the program gives up, say), the
// receipt Do returns cannot be recorded: Effect's error wraps ErrClosed,
// says the effect happened, with its receipt, and what settles it; the
// next session finds it in doubt. The error was "runstate: run is
// closed" alone, which reads as if nothing was sent.
func TestEffectWhoseRunClosesDuringDo(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := i3Open(t, dir, nil)
	_, err := r.Effect(ctx, "page", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		require.NoError(t, r.Close())
		return json.RawMessage(`{"id":"T-7"}`), nil
	}})
	require.ErrorIs(t, err, runstate.ErrClosed)
	assert.Contains(t, err.Error(), `effect page happened (Do returned the receipt {"id":"T-7"}), but its confirmation could not be recorded`)
	assert.Contains(t, err.Error(), "resolve it with: runstate resolve")

	r2 := i3Open(t, dir, nil)
	assert.Equal(t, runstate.EffectInDoubt, i3Effect(t, r2, "page").State)
}

func TestEffectArguments(t *testing.T) {
	ctx := context.Background()
	r := i3Open(t, t.TempDir(), nil)
	do := func(context.Context, string) (json.RawMessage, error) { return nil, nil }
	_, err := r.Effect(ctx, "", runstate.Effect{Do: do})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = r.Effect(ctx, "a\nb", runstate.Effect{Do: do})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = r.Effect(ctx, "k", runstate.Effect{})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	_, err = r.Effect(ctx, "k", runstate.Effect{Do: do, Request: func() {}})
	assert.ErrorIs(t, err, runstate.ErrInvalid)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.Effect(cctx, "k", runstate.Effect{Do: do})
	assert.ErrorIs(t, err, context.Canceled)

	// A nil receipt is recorded as null and returned as such.
	got, err := r.Effect(ctx, "k", runstate.Effect{Do: do})
	require.NoError(t, err)
	assert.Equal(t, "null", string(got))

	require.NoError(t, r.Close())
	_, err = r.Effect(ctx, "k2", runstate.Effect{Do: do})
	assert.ErrorIs(t, err, runstate.ErrClosed)
	assert.ErrorIs(t, r.Resolve(ctx, "k", runstate.Resolution{By: "ann"}), runstate.ErrClosed)
}

// One key is attempted by one session at a time: while Do runs, every
// other caller, in this session or another, gets ErrBusy.
func TestEffectOneAttemptAtATime(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := i3Open(t, dir, nil)
	b := i3Open(t, dir, nil) // a second session in the same process

	entered := make(chan struct{})
	release := make(chan struct{})
	var dos atomic.Int32
	slow := runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		dos.Add(1)
		close(entered)
		<-release
		return json.RawMessage(`"ok"`), nil
	}}
	done := make(chan error, 1)
	go func() {
		_, err := a.Effect(ctx, "k", slow)
		done <- err
	}()
	<-entered
	_, err := a.Effect(ctx, "k", slow)
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), "this session")
	_, err = b.Effect(ctx, "k", slow)
	require.ErrorIs(t, err, runstate.ErrBusy)
	assert.Contains(t, err.Error(), a.Session())
	require.ErrorIs(t, b.Resolve(ctx, "k", runstate.Resolution{By: "ann"}), runstate.ErrInvalid, "a live intent is not resolved")
	close(release)
	require.NoError(t, <-done)

	// Many goroutines over two sessions race for fresh keys: each key is
	// sent once, and every caller ends with its receipt.
	const keys, callers = 4, 8
	var sends [keys]atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, keys*callers)
	for k := range keys {
		for c := range callers {
			run := a
			if c%2 == 1 {
				run = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("race-%d", k)
				e := runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
					sends[k].Add(1)
					time.Sleep(time.Millisecond)
					return json.RawMessage(fmt.Sprintf(`{"k":%d}`, k)), nil
				}}
				deadline := time.Now().Add(30 * time.Second)
				for {
					got, err := run.Effect(ctx, key, e)
					if errors.Is(err, runstate.ErrBusy) && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
						continue
					}
					if err == nil && string(got) != fmt.Sprintf(`{"k":%d}`, k) {
						err = fmt.Errorf("%s: receipt %s", key, got)
					}
					errs <- err
					return
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	for k := range keys {
		assert.EqualValues(t, 1, sends[k].Load(), "race-%d sent once", k)
	}
	assert.EqualValues(t, 1, dos.Load())
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	assert.Zero(t, st.Metrics.EffectsDuplicated)
	assert.Equal(t, keys*callers-keys, st.Metrics.EffectsDeduplicated, "every caller but the sender got the stored receipt")
}

// When another session settles an effect while this one asks Check, this
// one looks again and returns the other's outcome, not a second send.
func TestEffectSettledByAnotherSessionMeanwhile(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a := i3Open(t, dir, nil)
	b := i3Open(t, dir, nil)
	_, err := a.Effect(ctx, "k", runstate.Effect{Do: func(context.Context, string) (json.RawMessage, error) {
		return nil, errors.New("timeout")
	}})
	require.ErrorIs(t, err, runstate.ErrUnconfirmed)

	var dos atomic.Int32
	do := func(context.Context, string) (json.RawMessage, error) {
		dos.Add(1)
		return json.RawMessage(`{"id":8}`), nil
	}
	checking := make(chan struct{})
	release := make(chan struct{})
	type result struct {
		receipt json.RawMessage
		err     error
	}
	done := make(chan result, 1)
	go func() {
		got, err := a.Effect(ctx, "k", runstate.Effect{Do: do, Check: func(context.Context, string) (json.RawMessage, bool, error) {
			close(checking)
			<-release
			return nil, false, nil // a stale answer: b confirmed it meanwhile
		}})
		done <- result{got, err}
	}()
	<-checking
	got, err := b.Effect(ctx, "k", runstate.Effect{Do: do, Check: func(context.Context, string) (json.RawMessage, bool, error) {
		return json.RawMessage(`{"id":7}`), true, nil
	}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"id":7}`, string(got))
	close(release)
	res := <-done
	require.NoError(t, res.err)
	assert.JSONEq(t, `{"id":7}`, string(res.receipt))
	assert.Zero(t, dos.Load(), "nobody sent it again")
	assert.Equal(t, []string{"intent", "unconfirmed", "confirm"}, i3Evs(i3Records(t, dir), "k"))
}

// A receipt nested deep (the writer takes up to 200 levels: JSON a
// receiving system may return) is kept compact in manifest.json. Indented,
// each of its lines went as many spaces further in as it is deep: a 20 KB
// receipt made a manifest.json of megabytes, rewritten as the run goes on
// and read by every Open and status.
func TestEffectDeepReceiptKeepsTheManifestSmall(t *testing.T) {
	r, dir := newTestRun(t)
	const depth = 190
	receipt := strings.Repeat("[", depth) + strings.Repeat("0,", 10000) + "0" + strings.Repeat("]", depth)
	got, err := r.Effect(context.Background(), "deep", runstate.Effect{
		Do: func(context.Context, string) (json.RawMessage, error) { return json.RawMessage(receipt), nil },
	})
	require.NoError(t, err)
	assert.JSONEq(t, receipt, string(got))
	require.NoError(t, r.Close())
	fi, err := os.Stat(filepath.Join(dir, "manifest.json"))
	require.NoError(t, err)
	assert.Less(t, fi.Size(), int64(2*len(receipt)+64<<10), "manifest.json for a %d-byte receipt", len(receipt))

	st, err := runstate.Inspect(dir)
	require.NoError(t, err)
	require.Len(t, st.Effects, 1)
	assert.JSONEq(t, receipt, string(st.Effects[0].Receipt))
	r2, err := runstate.Open(dir, testOptions())
	require.NoError(t, err)
	again, err := r2.Effect(context.Background(), "deep", runstate.Effect{
		Do: func(context.Context, string) (json.RawMessage, error) { return nil, errors.New("sent twice") },
	})
	require.NoError(t, err)
	assert.JSONEq(t, receipt, string(again), "the stored receipt, from the manifest resumed")
	require.NoError(t, r2.Close())
}
