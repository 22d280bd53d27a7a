package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The wire's backend ended by the server between two checkpoints (an
// administrator's pg_terminate_backend, a pooler's or failover's cut): the
// next Do's begin goes to a connection the server has closed, before the
// wire prepared its statement (nothing sent: the batch is decided again
// under the lock) or after (sent: its outcome is settled by content).
// Either way the stage is begun and completed once, and the run goes on,
// on a new wire.
func TestWireBackendTerminatedBetweenCheckpoints(t *testing.T) {
	for _, prepared := range []bool{false, true} {
		t.Run(map[bool]string{false: "unprepared", true: "prepared"}[prepared], func(t *testing.T) {
			wireTerminated(t, prepared)
		})
	}
}

func wireTerminated(t *testing.T, prepared bool) {
	db := newTestDB(t)
	ctx := context.Background()
	st, run := openAlone(t, db, "wireterm")
	if prepared { // a begin and a complete on the wire: both forms prepared
		require.NoError(t, doOutput(ctx, run, "before"))
	}
	st.ahead.mu.Lock()
	w := st.ahead.w
	st.ahead.mu.Unlock()
	require.NotNil(t, w, "the session alone has its wire")
	var ok bool
	require.NoError(t, db.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int64(w.pid)).Scan(&ok))
	require.True(t, ok)
	require.Eventually(t, func() bool {
		var n int
		err := db.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(w.pid)).Scan(&n)
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "the backend ended")

	err := doOutput(ctx, run, "after-kill")
	require.NoError(t, err, "the checkpoint after the wire's backend ended")
	require.NoError(t, doOutput(ctx, run, "then"), "the run goes on")
	st.ahead.mu.Lock()
	assert.NotSame(t, w, st.ahead.w, "the ended wire is dropped")
	st.ahead.mu.Unlock()
	require.NoError(t, run.Close())
	recs := ledger(t, db, "wireterm")
	for _, stage := range []string{"after-kill", "then"} {
		assert.Equal(t, map[int]int{1: 1}, completesOf(recs, stage), stage)
		assert.Equal(t, []string{"begin 1", "complete 1"}, stageEvents(recs, stage), stage)
	}
	rep, err := db.Verify(ctx, "wireterm")
	require.NoError(t, err)
	assert.True(t, rep.OK(), "%+v", rep.Problems)
}
