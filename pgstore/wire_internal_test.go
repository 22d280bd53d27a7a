package pgstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newWire is a wire on a connection of its own to the test server.
func newWire(t *testing.T) *wire {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testDSN(t))
	require.NoError(t, err)
	w, err := hijack(ctx, conn)
	require.NoError(t, err)
	t.Cleanup(w.terminate)
	return w
}

// sendOne writes one batch of sd with args and returns it.
func sendOne(t *testing.T, w *wire, sd *pgconn.StatementDescription, args ...any) *sentBatch {
	t.Helper()
	var eqb pgx.ExtendedQueryBuilder
	require.NoError(t, eqb.Build(w.tm, sd, args))
	w.out.SendBind(&pgproto3.Bind{PreparedStatement: sd.Name, ParameterFormatCodes: eqb.ParamFormats,
		Parameters: eqb.ParamValues, ResultFormatCodes: eqb.ResultFormats})
	w.out.SendExecute(&pgproto3.Execute{})
	sb := &sentBatch{}
	require.NoError(t, w.send(sb))
	return sb
}

// Each batch written gets its own reply, in order, whoever waits for it:
// a failed statement fails its batch alone (the server skips to its Sync),
// and goroutines waiting for later replies read the earlier ones for the
// others (run with -race).
func TestWireReadsEachReplyInOrder(t *testing.T) {
	w := newWire(t)
	sd, err := w.prepare("SELECT 1 / $1::int")
	require.NoError(t, err)
	divisors := []int{1, 0, 1, 1, 0, 1, 1, 1}
	sent := make([]*sentBatch, len(divisors))
	for i, d := range divisors {
		sent[i] = sendOne(t, w, sd, d)
	}
	var wg sync.WaitGroup
	for i := len(sent) - 1; i >= 0; i-- { // the last first: it reads the others' replies
		wg.Go(func() { w.wait(sent[i]) })
	}
	wg.Wait()
	for i, d := range divisors {
		var pe *pgconn.PgError
		if d == 0 {
			require.ErrorAs(t, sent[i].err, &pe, "batch %d divides by zero", i)
			assert.Equal(t, "22012", pe.Code, "batch %d", i)
		} else {
			assert.NoError(t, sent[i].err, "batch %d", i)
		}
	}
	// The connection is still good after the failed batches.
	rows, err := w.query("SELECT 6 * 7", 10*time.Second)
	require.NoError(t, err)
	assert.Equal(t, [][][]byte{{[]byte("42")}}, rows)
}

// Statements whose SQL shares its first 63 bytes (the server keeps 63
// bytes of a name: the append statements' forms all start alike) are
// prepared under names of their own, and each runs as itself.
func TestWirePreparesStatementsThatShareTheirStart(t *testing.T) {
	w := newWire(t)
	prefix := "SELECT /* " + strings.Repeat("x", 70) + " */ "
	a, err := w.prepare(prefix + "$1::int + 1")
	require.NoError(t, err)
	b, err := w.prepare(prefix + "$1::int * 10")
	require.NoError(t, err, "the second statement's name is taken by the first")
	require.NotEqual(t, a.Name, b.Name)
	require.Len(t, b.ParamOIDs, 1)
	require.Len(t, b.Fields, 1)
	sa, sb := sendOne(t, w, a, 4), sendOne(t, w, b, 4)
	w.wait(sb)
	require.NoError(t, sa.err)
	require.NoError(t, sb.err)
}

// Closing the connection fails every reply not read yet with an error that
// leaves its outcome unknown (ambiguous: settled by content), and wait
// returns for each.
func TestWireClosedFailsTheRepliesLeft(t *testing.T) {
	w := newWire(t)
	sd, err := w.prepare("SELECT pg_sleep($1::float8)")
	require.NoError(t, err)
	first, second := sendOne(t, w, sd, 0.3), sendOne(t, w, sd, 0)
	w.close()
	done := make(chan struct{})
	go func() {
		w.wait(second)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return after the connection was closed")
	}
	for _, sb := range []*sentBatch{first, second} {
		require.Error(t, sb.err)
		assert.True(t, ambiguous(sb.err), "a reply lost with the connection leaves the outcome unknown: %v", sb.err)
	}
	_, err = w.query("SELECT 1", time.Second)
	require.Error(t, err)
}

// A query whose reply does not come within its timeout closes the
// connection and says so, rather than waiting for ever.
func TestWireQueryTimesOut(t *testing.T) {
	w := newWire(t)
	start := time.Now()
	_, err := w.query("SELECT pg_sleep(30)", 200*time.Millisecond)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no reply in time")
	assert.Less(t, time.Since(start), 20*time.Second)
}

// Begins sent ahead without a complete between them (a pipeline that
// begins many stages before it ends any) do not pile up unread replies:
// past maxUnread the pipeline reads them back before it writes more, so
// that the server never blocks on a full socket while the client blocks
// writing to it. Every begin lands.
func TestPipelineReadsBackPastItsBound(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	old := maxUnread
	maxUnread = 4
	t.Cleanup(func() { maxUnread = old })
	st, run := openAlone(t, db, "unread")
	before := sentAhead(st)
	most := 0
	for i := range 30 {
		_, err := run.Begin(ctx, fmt.Sprintf("s%d", i))
		require.NoError(t, err)
		st.ahead.mu.Lock()
		most = max(most, len(st.ahead.sent))
		st.ahead.mu.Unlock()
	}
	require.Equal(t, 30, sentAhead(st)-before, "every begin went ahead of its reply")
	assert.LessOrEqual(t, most, 4, "replies left unread on the pipeline")
	require.NoError(t, run.Close())
	recs := ledger(t, db, "unread")
	for i := range 30 {
		stage := fmt.Sprintf("s%d", i)
		assert.Contains(t, stageEvents(recs, stage), "begin 1", stage)
	}
	rep, err := db.Verify(ctx, "unread")
	require.NoError(t, err)
	require.True(t, rep.OK(), "%+v", rep)
}
