package pgstore

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/require"
)

// TestPerfCheckpoint prints the median time of one checkpoint (Do with one
// small output) against one raw INSERT transaction of a ~300-byte row with
// synchronous_commit on, in alternating rounds on one server. It runs only
// with RUNSTATE_PG_PERF=1 (it measures, it asserts nothing but that both
// ran): RUNSTATE_PG_PERF=1 go test -run TestPerfCheckpoint -v .
func TestPerfCheckpoint(t *testing.T) {
	if os.Getenv("RUNSTATE_PG_PERF") == "" {
		t.Skip("set RUNSTATE_PG_PERF=1 to measure")
	}
	db := newTestDB(t)
	ctx := context.Background()
	_, err := db.pool.Exec(ctx, db.sql(`CREATE TABLE {s}.raw (id bigserial PRIMARY KEY, line bytea NOT NULL)`))
	require.NoError(t, err)
	row := []byte(strings.Repeat("x", 300))
	conn, err := db.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	run, err := db.Open(ctx, "perf", t.TempDir(), &runstate.Options{Request: "perf"})
	require.NoError(t, err)
	defer run.Close()
	const rounds, n = 10, 200
	var raw, cp []time.Duration
	k := 0
	for round := range rounds {
		for _, which := range []int{round % 2, 1 - round%2} {
			for range n {
				start := time.Now()
				if which == 0 {
					_, err = conn.Exec(ctx, db.sql(`INSERT INTO {s}.raw (line) VALUES ($1)`), row)
					require.NoError(t, err)
					raw = append(raw, time.Since(start))
				} else {
					// Ten stages, each redone with a new input value: the
					// run's size stays that of a real run (the handoff and
					// the state are O(stages)).
					k++
					name := fmt.Sprintf("s%d", k%10)
					err = run.Do(ctx, name, func(ctx context.Context, st *runstate.Stage) error {
						return st.WriteFile("out/"+name+".txt", []byte(fmt.Sprintf("result %d\n", k)))
					}, runstate.Value("round", k))
					require.NoError(t, err)
					cp = append(cp, time.Since(start))
				}
			}
		}
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	p99 := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)*99/100] }
	t.Logf("raw INSERT transaction: median %v p99 %v; checkpoint (Do + one small output): median %v p99 %v; ratio %.2f (%d rounds x %d, alternating)",
		med(raw), p99(raw), med(cp), p99(cp), float64(med(cp))/float64(med(raw)), rounds, n)
}

// TestPerfStoreAppend prints the median time of the store's own append
// batches (one record; Lock, Append, Sync or not, Unlock) against one raw
// INSERT transaction, interleaved: a checkpoint is one lazy batch (its
// begin) and one synced batch (its complete). RUNSTATE_PG_PERF=1 only.
func TestPerfStoreAppend(t *testing.T) {
	if os.Getenv("RUNSTATE_PG_PERF") == "" {
		t.Skip("set RUNSTATE_PG_PERF=1 to measure")
	}
	db := newTestDB(t)
	ctx := context.Background()
	_, err := db.pool.Exec(ctx, db.sql(`CREATE TABLE {s}.raw (id bigserial PRIMARY KEY, line bytea NOT NULL)`))
	require.NoError(t, err)
	conn, err := db.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	row := []byte(strings.Repeat("x", 300))
	st := db.Store("r")
	sa := newSession(t)
	_, _, err = st.Open(ctx, sa)
	require.NoError(t, err)
	defer st.Close(true)
	var pos runstate.Position
	var raw, synced, lazy []time.Duration
	for i := range 3000 {
		start := time.Now()
		switch i % 3 {
		case 0:
			_, err = conn.Exec(ctx, db.sql(`INSERT INTO {s}.raw (line) VALUES ($1)`), row)
			require.NoError(t, err)
			raw = append(raw, time.Since(start))
		case 1:
			pos = appendLines(t, st, pos, sa, 1, true)
			synced = append(synced, time.Since(start))
		case 2:
			pos = appendLines(t, st, pos, sa, 1, false)
			lazy = append(lazy, time.Since(start))
		}
	}
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	t.Logf("raw INSERT transaction %v; store batch synced %v (%.2fx), lazy %v (%.2fx); 1000 each, interleaved",
		med(raw), med(synced), float64(med(synced))/float64(med(raw)), med(lazy), float64(med(lazy))/float64(med(raw)))
}
