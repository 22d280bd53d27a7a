package runstatetest_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// The pipeline under test, shared by the in-process tests and the child
// processes of the crash suite: a fetch stage, four parts that depend on
// it (several processes can work on them at once), an effect that files a
// ticket, a report that depends on the parts and the ticket, an effect
// that notifies, and a publish stage. Every output is deterministic.

const (
	envReceiver = "RUNSTATETEST_SUITE_RECEIVER" // base URL of the fake receiving system
	envAcks     = "RUNSTATETEST_SUITE_ACKS"     // file the pipeline appends acknowledgements to
	suiteReq    = "crash suite: build the report"
)

var parts = []string{"part/0", "part/1", "part/2", "part/3"}

func suiteStages() []string {
	return append(append([]string{"fetch"}, parts...), "report", "publish")
}

// suiteOptions are the Options of every Open in the suite.
func suiteOptions() *runstate.Options { return &runstate.Options{Request: suiteReq} }

// sender delivers effects to the fake receiving system.
type sender struct {
	base   string
	client *http.Client
}

func newSender(base string) *sender {
	return &sender{base: base, client: &http.Client{Timeout: 10 * time.Second}}
}

func (s *sender) effect(req any) runstate.Effect {
	body, _ := json.Marshal(req)
	return runstate.Effect{
		Request: req,
		Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			r, err := http.NewRequestWithContext(ctx, "POST", s.base+"/send", bytes.NewReader(body))
			if err != nil {
				return nil, err
			}
			r.Header.Set("Idempotency-Key", key)
			return s.do(r, true)
		},
		Check: func(ctx context.Context, key string) (json.RawMessage, bool, error) {
			r, err := http.NewRequestWithContext(ctx, "GET", s.base+"/check", nil)
			if err != nil {
				return nil, false, err
			}
			r.Header.Set("Idempotency-Key", key)
			rec, err := s.do(r, false)
			if errors.Is(err, errNotFound) {
				return nil, false, nil
			}
			return rec, err == nil, err
		},
	}
}

var errNotFound = errors.New("not found")

func (s *sender) do(r *http.Request, _ bool) (json.RawMessage, error) {
	resp, err := s.client.Do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK:
		return data, nil
	case http.StatusNotFound:
		return nil, errNotFound
	}
	return nil, fmt.Errorf("receiver: %s: %s", resp.Status, data)
}

// retry calls fn until it returns something other than ErrBusy or
// ErrNotReady: another live session holds the stage or effect, or a stage
// it depends on is still running elsewhere.
func retry(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := fn()
		if !errors.Is(err, runstate.ErrBusy) && !errors.Is(err, runstate.ErrNotReady) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(3 * time.Millisecond):
		}
	}
}

// acker records what the pipeline was told is durable, so that the parent
// can check that no acknowledged record was lost.
type acker struct{ path string }

func (a acker) ack(run *runstate.Run, kind, name string) error {
	if a.path == "" {
		return nil
	}
	st, err := run.Status()
	if err != nil {
		return err
	}
	var seq int64
	switch kind {
	case "stage":
		s, _ := st.Stage(name)
		seq = s.DoneSeq
	case "effect":
		for _, e := range st.Effects {
			if e.Key == name {
				seq = e.Seq
			}
		}
	}
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "%s %s %d\n", kind, name, seq)
	return err
}

func writeText(path string, data []byte) func(context.Context, *runstate.Stage) error {
	return func(_ context.Context, st *runstate.Stage) error { return st.WriteFile(path, data) }
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// suitePipeline returns the pipeline, sending effects with s and
// acknowledging to a. start rotates the order of the parts, so that
// concurrent processes begin with different ones.
func suitePipeline(s *sender, a acker, start int) runstatetest.Pipeline {
	return func(ctx context.Context, run *runstate.Run) error {
		if err := retry(ctx, func() error { return run.Plan(ctx, suiteStages()...) }); err != nil {
			return err
		}
		do := func(name string, fn func(context.Context, *runstate.Stage) error, in ...runstate.Input) error {
			if err := retry(ctx, func() error { return run.Do(ctx, name, fn, in...) }); err != nil {
				return err
			}
			return a.ack(run, "stage", name)
		}
		effect := func(key string, e runstate.Effect) (json.RawMessage, error) {
			var rec json.RawMessage
			err := retry(ctx, func() error {
				var err error
				rec, err = run.Effect(ctx, key, e)
				return err
			})
			if err != nil {
				return nil, err
			}
			return rec, a.ack(run, "effect", key)
		}
		var raw bytes.Buffer
		for i := 0; i < 64; i++ {
			fmt.Fprintf(&raw, "record %03d: value %d\n", i, i*i%97)
		}
		if err := do("fetch", writeText("artifacts/raw.txt", raw.Bytes())); err != nil {
			return err
		}
		// Parts: several processes may share them; go round until all
		// are done.
		lines := strings.SplitAfter(raw.String(), "\n")
		for i := range parts {
			p := (start + i) % len(parts)
			name := parts[p]
			var out bytes.Buffer
			for j := p; j < len(lines); j += len(parts) {
				out.WriteString(strings.ToUpper(lines[j]))
			}
			if err := do(name, writeText(fmt.Sprintf("artifacts/part-%d.txt", p), out.Bytes()), runstate.After("fetch")); err != nil {
				return err
			}
		}
		hashes := map[string]string{}
		for p := range parts {
			data, err := os.ReadFile(filepath.Join(run.Dir(), "artifacts", fmt.Sprintf("part-%d.txt", p)))
			if err != nil {
				return err
			}
			hashes[parts[p]] = sum(data)
		}
		ticket, err := effect("ticket", s.effect(map[string]any{"title": "report ready for review", "parts": hashes}))
		if err != nil {
			return err
		}
		report := fmt.Sprintf("# Report\n\nticket: %s\n", ticket)
		for p := range parts {
			report += fmt.Sprintf("- %s sha256:%s\n", parts[p], hashes[parts[p]])
		}
		in := []runstate.Input{runstate.Value("ticket", ticket)}
		for _, p := range parts {
			in = append(in, runstate.After(p))
		}
		if err := do("report", writeText("artifacts/report.md", []byte(report)), in...); err != nil {
			return err
		}
		notice, err := effect("notify", s.effect(map[string]any{"text": "report published", "report": sum([]byte(report))}))
		if err != nil {
			return err
		}
		return do("publish", writeText("artifacts/published.txt", []byte("published; notice "+string(notice)+"\n")),
			runstate.After("report"), runstate.Value("notice", notice))
	}
}

// childPipeline is the pipeline as a child process runs it: open, do the
// work, close.
func childPipeline(ctx context.Context, dir string) error {
	run, err := runstate.Open(dir, suiteOptions())
	if err != nil {
		return err
	}
	p := suitePipeline(newSender(os.Getenv(envReceiver)), acker{os.Getenv(envAcks)}, os.Getpid())
	if err := p(ctx, run); err != nil {
		run.Close()
		return err
	}
	return run.Close()
}

// receiver is the fake receiving system: it files each effect once per
// idempotency key (the key is honoured: a repeat gets the first receipt)
// and counts every request.
type receiver struct {
	srv *httptest.Server

	mu       sync.Mutex
	sends    map[string]int             // POSTs per full key
	receipts map[string]json.RawMessage // what was filed, by full key
}

func newReceiver(t testing.TB) *receiver {
	rv := &receiver{sends: map[string]int{}, receipts: map[string]json.RawMessage{}}
	rv.srv = httptest.NewServer(http.HandlerFunc(rv.serve))
	t.Cleanup(rv.srv.Close)
	return rv
}

func (rv *receiver) serve(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		http.Error(w, "no Idempotency-Key", http.StatusBadRequest)
		return
	}
	switch r.URL.Path {
	case "/send":
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the sender died mid-request: nothing filed
		}
		rv.mu.Lock()
		rv.sends[key]++
		rec, ok := rv.receipts[key]
		if !ok {
			// The receipt names the key without the run id, so that
			// every run of the pipeline gets the same one.
			_, local, _ := strings.Cut(key, ":")
			rec, _ = json.Marshal(map[string]string{"id": local + "-" + sum(append([]byte(local), body...))[:12]})
			rv.receipts[key] = rec
		}
		rv.mu.Unlock()
		w.Write(rec)
	case "/check":
		rv.mu.Lock()
		rec, ok := rv.receipts[key]
		rv.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(rec)
	default:
		http.NotFound(w, r)
	}
}

// deliveries reports, for the keys of run id, how many were filed and how
// many requests came for a key already filed (resends).
func (rv *receiver) deliveries(id string) (filed, resends int) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	for k, n := range rv.sends {
		if strings.HasPrefix(k, id+":") {
			filed++
			resends += n - 1
		}
	}
	return filed, resends
}

func (rv *receiver) env() string { return envReceiver + "=" + rv.srv.URL }

// lostAcks returns the acknowledgements in the file at path whose record
// is not in the ledger of dir.
func lostAcks(t testing.TB, dir, path string) (acked int, lost []string) {
	t.Helper()
	bySeq := map[int64]*runstate.Record{}
	require.NoError(t, runstate.ReadLedger(dir, func(r *runstate.Record) error {
		bySeq[r.Seq] = r
		return nil
	}))
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return 0, nil
	}
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			continue // a line cut short by a kill: never acknowledged to anyone
		}
		seq, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			continue
		}
		acked++
		r := bySeq[seq]
		ok := r != nil && (fields[0] == "stage" && r.Ev == "complete" && r.Stage == fields[1] ||
			fields[0] == "effect" && r.Ev == "confirm" && r.Key == fields[1])
		if !ok {
			lost = append(lost, sc.Text())
		}
	}
	return acked, lost
}
