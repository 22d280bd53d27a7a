package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/runstate/runstate/pgstore/internal/pgproxy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The pipeline's connection (the wire) lost around a Do's complete, on a
// session alone on its run: cut before its Sync reaches the server (not
// committed: the batch runs again under the lock) and after the server
// committed it (its reply lost): Do returns nil either way, the stage has
// exactly one complete, the wire is dropped and the next Do goes on a new
// one.
func TestWireCutAroundTheCompleteDoReturnsNilAndRecordsOnce(t *testing.T) {
	for _, cut := range []pgproxy.Cut{pgproxy.BeforeCommit, pgproxy.AfterCommit} {
		t.Run(cut.String(), func(t *testing.T) {
			p, db, _ := proxiedDB(t)
			ctx := context.Background()
			st, run := openAlone(t, db, "wirecut")
			st.ahead.mu.Lock()
			before := st.ahead.w
			st.ahead.mu.Unlock()
			require.NotNil(t, before, "the session alone has its wire")
			sent := sentAhead(st)

			a := p.Arm(pgproxy.Rule{Cut: cut, Match: []string{`"ev":"complete"`, `"stage":"cut"`}})
			err := doOutput(ctx, run, "cut")
			require.True(t, a.Wait(time.Second), "the proxy did not cut: %q", p.Log())
			require.NoError(t, err, "Do must return nil: the complete is re-run or found committed")
			assert.Equal(t, 1, sentAhead(st)-sent, "the stage's begin went ahead on the wire")
			st.ahead.mu.Lock()
			after := st.ahead.w
			st.ahead.mu.Unlock()
			assert.NotSame(t, before, after, "the cut wire is dropped")
			assert.Equal(t, map[int]int{1: 1}, completesOf(ledger(t, db, "wirecut"), "cut"))

			require.NoError(t, doOutput(ctx, run, "after"), "the run goes on")
			require.NoError(t, run.Close())
			assert.Equal(t, map[int]int{1: 1}, completesOf(ledger(t, db, "wirecut"), "after"))
			rep, err := db.Verify(ctx, "wirecut")
			require.NoError(t, err)
			assert.True(t, rep.OK(), "%+v", rep.Problems)
		})
	}
}
