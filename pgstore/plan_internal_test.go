package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// plansOf sums, over the connection's prepared statements whose text is
// LIKE pattern, how many times the server used their generic plan and how
// many times it planned them afresh (a custom plan).
func plansOf(ctx context.Context, t *testing.T, conn *pgx.Conn, pattern string) (generic, custom int64) {
	t.Helper()
	err := conn.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0)::bigint, coalesce(sum(custom_plans), 0)::bigint
		FROM pg_prepared_statements WHERE statement LIKE $1`, pattern).Scan(&generic, &custom)
	require.NoError(t, err)
	return generic, custom
}

// wirePlans is plansOf on the pipeline's connection. The caller holds
// ahead.mu and has read back what is on the pipeline.
func wirePlans(t *testing.T, w *wire, pattern string) (generic, custom int64) {
	t.Helper()
	rows, err := w.query(`SELECT coalesce(sum(generic_plans), 0)::bigint, coalesce(sum(custom_plans), 0)::bigint
		FROM pg_prepared_statements WHERE statement LIKE '`+strings.ReplaceAll(pattern, "'", "''")+`'`, 10*time.Second)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	generic, err = strconv.ParseInt(string(rows[0][0]), 10, 64)
	require.NoError(t, err)
	custom, err = strconv.ParseInt(string(rows[0][1]), 10, 64)
	require.NoError(t, err)
	return generic, custom
}

// arrayPlans is plansOf the array form of the append statement
// (appendSQL, locked or bet).
func arrayPlans(ctx context.Context, t *testing.T, conn *pgx.Conn) (generic, custom int64) {
	t.Helper()
	return plansOf(ctx, t, conn, "%unnest($2::bigint[]%")
}

// The array form of the append statement, which commits a batch of
// several records (8 goroutines on one run), runs on its generic plan,
// planned once per connection, on the pool's connections and on the
// pipeline's: the server would otherwise plan it afresh at every batch
// (genericPlanSQL).
func TestBatchesOfSeveralRecordsRunOnTheGenericPlan(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	for _, alone := range []bool{false, true} {
		t.Run(fmt.Sprintf("alone=%v", alone), func(t *testing.T) {
			name := fmt.Sprintf("plans-%v", alone)
			var run *runstate.Run
			var st *store
			if alone {
				st, run = openAlone(t, db, name) // its batches go on the pipeline
			} else {
				run, st = openOptimist(t, db, name) // on the pool's connections (not alone before a ping)
			}
			var generic, custom, onPipe int64
			for round := 0; round < 5 && generic+custom == 0; round++ {
				var wg sync.WaitGroup
				for g := range 8 {
					wg.Go(func() {
						for k := range 10 {
							assert.NoError(t, doOutput(ctx, run, fmt.Sprintf("r%d-g%d-%d", round, g, k)))
						}
					})
				}
				wg.Wait()
				require.False(t, t.Failed())
				generic, custom, onPipe = 0, 0, 0
				conns := db.pool.AcquireAllIdle(ctx)
				for _, c := range conns {
					g, c2 := arrayPlans(ctx, t, c.Conn())
					generic, custom = generic+g, custom+c2
					c.Release()
				}
				a := &st.ahead
				a.mu.Lock()
				if a.w != nil {
					require.NoError(t, st.readBack(ctx))
					g, c2 := wirePlans(t, a.w, "%unnest($2::bigint[]%")
					generic, custom, onPipe = generic+g, custom+c2, onPipe+g+c2
				}
				a.mu.Unlock()
			}
			require.Positive(t, generic+custom, "no batch of several records in 5 rounds of 8 goroutines")
			require.Zero(t, custom, "the array form was planned afresh %d times (and ran %d times on its generic plan)", custom, generic)
			if alone {
				require.Positive(t, onPipe, "no batch of several records went on the pipeline")
			}
			checkChain(t, db, name)
		})
	}
}

// Lock reads the tail with its statement's generic plan, an index scan
// planned once per connection, not afresh at every Lock (lockSetupSQL,
// tailSQL); and a locked batch of several records runs the array form on
// its generic plan too. The tail it reads is still every record after
// the position, in order.
func TestLockReadsTheTailOnTheGenericPlan(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	a := db.Store("tailplans").(*store)
	sa := newSessionID()
	_, _, err := a.Open(ctx, sa)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(true) })
	b := db.Store("tailplans").(*store)
	sb := newSessionID()
	_, bt, err := b.Open(ctx, sb)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close(true) })
	var at runstate.Position
	for k := range 12 { // the two sessions take turns: each Lock reads the other's records
		at = appendLines(t, a, bt, sa, 1+k%3, true)
		bt = appendLines(t, b, at, sb, 1+k%2, true)
	}
	require.Equal(t, bt.Seq, int64(len(checkChain(t, db, "tailplans"))))

	var generic, custom int64
	var arrays [2]int64
	for _, c := range db.pool.AcquireAllIdle(ctx) {
		g, cu := plansOf(ctx, t, c.Conn(), "%AND seq <= $3 ORDER BY seq")
		generic, custom = generic+g, custom+cu
		g, cu = arrayPlans(ctx, t, c.Conn())
		arrays[0], arrays[1] = arrays[0]+g, arrays[1]+cu
		c.Release()
	}
	require.Positive(t, generic+custom, "no Lock read a tail through the pool")
	require.Zero(t, custom, "Lock's tail read was planned afresh %d times (and ran %d times on its generic plan)", custom, generic)
	require.Positive(t, arrays[0]+arrays[1], "no locked batch of several records")
	require.Zero(t, arrays[1], "a locked batch's array form was planned afresh")
}
