package pgstore

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refuseComplete makes the server refuse every batch with a complete of
// stage (a trigger's error).
func refuseComplete(t *testing.T, db *DB, stage string) {
	t.Helper()
	ctx := context.Background()
	_, err := db.pool.Exec(ctx, db.sql(`CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.stage = '`+stage+`' AND NEW.ev = 'complete' THEN RAISE EXCEPTION 'injected: refused'; END IF;
  RETURN NEW;
END $$`))
	require.NoError(t, err)
	_, err = db.pool.Exec(ctx, db.sql(`CREATE TRIGGER refuse BEFORE INSERT ON {s}.records FOR EACH ROW EXECUTE FUNCTION {s}.refuse()`))
	require.NoError(t, err)
}

// A batch that the server refuses with an error of SQL (here a trigger's,
// on one stage's complete) records nothing, and the session goes on: the
// next Do records, and the run is one gapless chain. Alone on the run (a
// bet) and beside another session (a locked batch).
func TestABatchTheServerRefusesLeavesTheSessionWhole(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t)
			refuseComplete(t, db, "refused")
			r, _ := openOptimist(t, db, "f")
			var err error
			if shared {
				other, _ := openOptimist(t, db, "f")
				require.NoError(t, other.Do(ctx, "other", func(context.Context, *runstate.Stage) error { return nil }))
			}
			require.NoError(t, r.Do(ctx, "before", func(context.Context, *runstate.Stage) error { return nil }))
			err = r.Do(ctx, "refused", func(_ context.Context, st *runstate.Stage) error { return st.WriteFile("refused.txt", []byte("x")) })
			require.Error(t, err)
			require.Contains(t, err.Error(), "injected: refused")
			for i := range 3 {
				err := r.Do(ctx, fmt.Sprintf("after-%d", i), func(_ context.Context, st *runstate.Stage) error {
					return st.WriteFile(fmt.Sprintf("after-%d.txt", i), []byte("y"))
				})
				if err != nil {
					require.ErrorIs(t, err, runstate.ErrReadOnly, "the session goes on, or says it is read-only: %v", err)
				}
			}
			checkChain(t, db, "f")
		})
	}
}

// The same with goroutines: one stage's complete is refused, in a batch
// with others' records, which fail with it; what was recorded is one
// gapless chain with one complete per attempt. (The session is then done
// for: later Do calls fail, some with messages that blame a lost server
// write or a damaged chain instead of the refused batch; see the issue's
// note of 2026-12-07.)
func TestABatchTheServerRefusesAmongGoroutines(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t)
			refuseComplete(t, db, "s0-w0-5")
			n := 1
			if shared {
				n = 2
			}
			var runs []*runstate.Run
			for range n {
				r, _ := openOptimist(t, db, "f")
				runs = append(runs, r)
			}
			var mu sync.Mutex
			var errs []error
			var wg sync.WaitGroup
			for i, r := range runs {
				for w := range 3 {
					wg.Go(func() {
						for k := range 12 {
							name := fmt.Sprintf("s%d-w%d-%d", i, w, k)
							err := r.Do(ctx, name, func(_ context.Context, st *runstate.Stage) error {
								return st.WriteFile("out/"+name, []byte(name))
							})
							if err != nil {
								mu.Lock()
								errs = append(errs, fmt.Errorf("%s: %w", name, err))
								mu.Unlock()
								return
							}
						}
					})
				}
			}
			wg.Wait()
			for _, err := range errs {
				t.Log(err)
				for _, blame := range []string{"records it saw are gone", "prev hash does not match", "is not the one this session read"} {
					assert.NotContains(t, err.Error(), blame, "the refused batch is the cause, not a lost server write or a broken chain")
				}
			}
			require.NotEmpty(t, errs, "the refused complete's Do failed")
			checkChain(t, db, "f")
		})
	}
}
