package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// workerArgs are the worker role's arguments: a "machine" (a process with
// a working directory of its own) running goroutines on one shared run.
type workerArgs struct {
	runArgs
	Receiver   string // base URL of the counting receiver
	Goroutines int
	Stages     int // a0..aN-1, and bI After(aI)
}

func init() { roles["worker"] = workerRole }

// stageContent is what stage a_i writes: deterministic, a few chunks of
// bytes so that blobs have some size.
func stageContent(name string) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < 20000; i++ {
		fmt.Fprintf(&b, "%s line %d\n", name, i)
	}
	return b.Bytes()
}

// workerRole runs every stage it can until all are done: a_i writes
// artifacts/a_i.txt and sends effect eff-a_i; b_i, After(a_i), checks the
// materialized artifacts/a_i.txt byte for byte, writes artifacts/b_i.txt
// and sends eff-b_i. A stage another session holds (ErrBusy) or one not
// ready yet (ErrNotReady) is tried again later.
func workerRole(ctx context.Context, raw json.RawMessage, cio *childIO) error {
	var a workerArgs
	run, closeDB, err := openRun(ctx, raw, &a)
	if err != nil {
		return err
	}
	defer closeDB()
	defer run.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	effect := func(ctx context.Context, st *runstate.Stage) error {
		_, err := st.Run().Effect(ctx, "eff-"+st.Name(), runstate.Effect{Request: st.Name(), Do: func(ctx context.Context, key string) (json.RawMessage, error) {
			resp, err := client.Post(a.Receiver+"/effect?key="+url.QueryEscape(key), "text/plain", nil)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return nil, err
			}
			return json.RawMessage(body), nil
		}})
		return err
	}
	var stages []string
	for i := range a.Stages {
		stages = append(stages, fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i))
	}
	var wg sync.WaitGroup
	errs := make(chan error, a.Goroutines)
	var ran sync.Map // stage -> this process ran its function to the end
	for g := range a.Goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			order := append([]string(nil), stages...)
			rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			left := map[string]bool{}
			for _, s := range order {
				left[s] = true
			}
			for tries := 0; len(left) > 0; tries++ {
				if tries > 2000 {
					errs <- fmt.Errorf("goroutine %d: stages %v not done after %d rounds", g, left, tries)
					return
				}
				for _, s := range order {
					if !left[s] {
						continue
					}
					var inputs []runstate.Input
					dep := ""
					if s[0] == 'b' {
						dep = "a" + s[1:]
						inputs = append(inputs, runstate.After(dep))
					}
					err := run.Do(ctx, s, func(ctx context.Context, st *runstate.Stage) error {
						if dep != "" {
							got, err := os.ReadFile(filepath.Join(a.Dir, "artifacts", dep+".txt"))
							if err != nil {
								return fmt.Errorf("%s: After(%s)'s output is not here: %w", s, dep, err)
							}
							if !bytes.Equal(got, stageContent(dep)) {
								return runstate.Fatal(fmt.Errorf("%s: After(%s)'s output differs from what %s wrote", s, dep, dep))
							}
						}
						if err := st.WriteFile("artifacts/"+s+".txt", stageContent(s)); err != nil {
							return err
						}
						if err := effect(ctx, st); err != nil {
							return err
						}
						ran.Store(s, true)
						return nil
					}, inputs...)
					switch {
					case err == nil:
						delete(left, s)
					case errors.Is(err, runstate.ErrDone):
						delete(left, s)
					case errors.Is(err, runstate.ErrBusy), errors.Is(err, runstate.ErrNotReady):
					default:
						errs <- fmt.Errorf("goroutine %d: %s: %w", g, s, err)
						return
					}
				}
				time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	var mine []string
	ran.Range(func(k, _ any) bool { mine = append(mine, k.(string)); return true })
	cio.send("ran", mine)
	return nil
}

// receiver counts the effects it is sent, by key.
type receiver struct {
	mu   sync.Mutex
	seen map[string]int
	srv  *http.Server
	url  string
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	r := &receiver{seen: map[string]int{}, url: "http://" + ln.Addr().String()}
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		key := req.URL.Query().Get("key")
		r.mu.Lock()
		r.seen[key]++
		n := r.seen[key]
		r.mu.Unlock()
		fmt.Fprintf(w, `{"key":%q,"n":%d}`, key, n)
	})}
	go r.srv.Serve(ln)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

// Four processes, each a "machine" with a working directory of its own,
// four goroutines each, share one run of stages a0..a7 and b0..b7
// (bI After(aI)), each sending an effect to a receiver on 127.0.0.1. Then:
// the ledger verifies (seq gapless, the chain), at most one complete per
// (stage, attempt), every stage done once, no duplicated work or effect,
// the receiver saw each key once, and every directory's copy of an
// output, made there or materialized from the store, is byte-equal to
// what its stage wrote and to the blob.
func TestMachinesShareOneRun(t *testing.T) {
	const procs, goroutines, stages = 4, 4, 8
	dsn := withSchema(testDSN(t), newSchema(t))
	ctx := context.Background()
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	recv := newReceiver(t)
	start := time.Now()
	var children []*child
	var dirs []string
	for p := range procs {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("machine%d", p))
		dirs = append(dirs, dir)
		children = append(children, startChild(t, "worker", workerArgs{runArgs: runArgs{DSN: dsn, Run: "shared", Dir: dir},
			Receiver: recv.url, Goroutines: goroutines, Stages: stages}))
	}
	ranBy := map[string][]int{}
	for p, ch := range children {
		var ran []string
		ch.expect("ran", 3*time.Minute, &ran)
		require.NoError(t, ch.wait(time.Minute), "machine %d: %s", p, ch.output())
		for _, s := range ran {
			ranBy[s] = append(ranBy[s], p)
		}
	}
	t.Logf("%d processes x %d goroutines, %d stages: %v", procs, goroutines, 2*stages, time.Since(start).Round(time.Millisecond))

	rep, err := db.Verify(ctx, "shared")
	require.NoError(t, err)
	assert.True(t, rep.OK(), "Verify: %+v", rep.Problems)
	completes := map[string]int{}
	var seq int64
	require.NoError(t, db.ReadLedger(ctx, "shared", func(r *runstate.Record) error {
		seq++
		assert.Equal(t, seq, r.Seq, "seq is gapless")
		if r.Ev == "complete" {
			completes[fmt.Sprintf("%s/%d", r.Stage, r.Attempt)]++
		}
		return nil
	}))
	st, err := db.Inspect(ctx, "shared")
	require.NoError(t, err)
	assert.Zero(t, st.Metrics.DuplicatedWork)
	assert.Zero(t, st.Metrics.EffectsDuplicated)
	blobs := db.Store("shared").Blobs()
	for i := range stages {
		for _, s := range []string{fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)} {
			assert.Equal(t, 1, completes[s+"/1"], "stage %s: one complete, of attempt 1", s)
			assert.Len(t, ranBy[s], 1, "stage %s ran in exactly one process: %v", s, ranBy[s])
			i := slices.IndexFunc(st.Stages, func(x runstate.StageStatus) bool { return x.Name == s })
			require.GreaterOrEqual(t, i, 0, "stage %s is in the status", s)
			ss := st.Stages[i]
			assert.Equal(t, runstate.StateComplete, ss.State, "stage %s", s)
			require.Len(t, ss.Outputs, 1)
			want := stageContent(s)
			sum := sha256.Sum256(want)
			assert.Equal(t, hex.EncodeToString(sum[:]), ss.Outputs[0].SHA256, "stage %s's recorded output", s)
			rc, err := blobs.Get(ctx, ss.Outputs[0].SHA256)
			require.NoError(t, err, "stage %s's blob", s)
			blob, err := io.ReadAll(rc)
			rc.Close()
			require.NoError(t, err)
			assert.True(t, bytes.Equal(want, blob), "stage %s's blob differs from what it wrote", s)
			for p, dir := range dirs {
				got, err := os.ReadFile(filepath.Join(dir, "artifacts", s+".txt"))
				if errors.Is(err, os.ErrNotExist) {
					continue // this machine neither made it nor needed it
				}
				require.NoError(t, err)
				assert.True(t, bytes.Equal(want, got), "machine %d's copy of %s differs", p, s)
			}
		}
	}
	cross := 0
	for i := range stages {
		a, b := ranBy[fmt.Sprintf("a%d", i)], ranBy[fmt.Sprintf("b%d", i)]
		if len(a) == 1 && len(b) == 1 && a[0] != b[0] {
			cross++
		}
	}
	t.Logf("%d of %d After(a) stages ran on another machine than their a (their input materialized from the store)", cross, stages)
	for k, n := range completes {
		assert.LessOrEqual(t, n, 1, "complete of %s", k)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	assert.Len(t, recv.seen, 2*stages, "the receiver saw one key per stage: %v", recv.seen)
	for k, n := range recv.seen {
		assert.Equal(t, 1, n, "effect %s sent %d times", k, n)
	}
}
