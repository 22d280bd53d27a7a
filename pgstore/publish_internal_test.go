package pgstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A large manifest never rides in a batch's commit, and a batch starts
// no write beside it (which would need a second pool connection): its
// take leaves the manifest kept, and takes the handoff that is due. The
// idle write takes it; while that write is under way a batch gets
// nothing. The next large manifest waits largePace times as long as that
// write took (take leaves it kept, due says the Run need not render
// one), then the idle write takes it again. A small one goes with the
// batch as before, and a clean Close's write takes a large one whatever
// the pace.
func TestLargeManifestGoesByAWriteOfItsOwn(t *testing.T) {
	// An idle timer that never fires stands for one armed already, so
	// that no idle write (armLocked) starts on its own: the test takes
	// its part.
	p := &published{large: 10, idle: time.NewTimer(time.Hour)}
	defer p.idle.Stop()
	writes := 0
	p.write = func() { writes++ }
	at := func(seq int64) runstate.Position { return runstate.Position{Seq: seq} }
	large := []byte(strings.Repeat("m", 100))

	p.keep(at(1), large, []byte("handoff 1"))
	m, h := p.take(time.Now(), false, true)
	assert.Nil(t, m, "a batch takes no large manifest")
	require.NotNil(t, h, "the handoff that is due goes with the batch")
	assert.Equal(t, "handoff 1", string(h.data))

	require.True(t, p.startOwn(), "the idle write")
	p.keep(at(2), nil, []byte("handoff 2"))
	m, h = p.take(time.Now(), false, true)
	assert.Nil(t, m)
	assert.Nil(t, h, "while a write of its own is under way, a batch leaves the projections row to it")
	assert.False(t, p.startOwn(), "another idle write finds it under way and leaves")
	t0 := time.Now()
	m, _ = p.take(t0, false, false)
	require.NotNil(t, m, "the write of its own takes the manifest")
	assert.Equal(t, int64(1), m.at.Seq)
	p.endOwn(p.largeOne(m), t0.Add(-time.Second)) // as if it took a second

	p.mu.Lock()
	after, cost, own := p.largeAfter, p.largeCost, p.own
	p.mu.Unlock()
	assert.False(t, own)
	assert.GreaterOrEqual(t, cost, time.Second, "the write's time")
	assert.WithinDuration(t, time.Now().Add(largePace*cost), after, 5*time.Second, "the next large manifest waits largePace times as long")
	manifestDue, _ := p.due(time.Now())
	assert.False(t, manifestDue, "the Run need not render a large manifest before its pace allows")

	p.keep(at(3), large, nil)
	m, _ = p.take(time.Now(), false, true)
	assert.Nil(t, m, "a batch leaves it")
	m, _ = p.take(time.Now(), false, false)
	assert.Nil(t, m, "an idle write before its pace allows leaves it too")
	manifestDue, _ = p.due(after)
	assert.True(t, manifestDue, "due once the pace allows")
	p.mu.Lock()
	p.largeAfter = time.Now() // as if the pace's time had passed
	p.mu.Unlock()
	m, _ = p.take(time.Now(), false, true)
	assert.Nil(t, m, "a batch never takes it, pace or not")
	m, _ = p.take(time.Now(), false, false)
	require.NotNil(t, m, "the idle write takes it once the pace allows")
	assert.Equal(t, int64(3), m.at.Seq)
	assert.Zero(t, writes, "no take started a write")

	p.keep(at(4), []byte("small"), nil)
	m, _ = p.take(time.Now(), false, true)
	require.NotNil(t, m, "a small manifest goes with the batch, pace or not")
	assert.Equal(t, "small", string(m.data))

	p.mu.Lock()
	p.largeAfter = time.Now().Add(time.Hour)
	p.mu.Unlock()
	p.keep(at(5), large, nil)
	m, _ = p.take(time.Now(), true, false)
	require.NotNil(t, m, "a clean Close's write takes a large manifest whatever the pace")
	assert.Equal(t, int64(5), m.at.Seq)
}

// A one-shot session (the runstate command's: open, a record, Close) on
// a run whose manifest is large starts one pool connection, and its lock
// connection is Connect's spare: the manifest goes by the clean Close's
// write, after the batches, not beside one of them on a second
// connection. The projections row holds the manifest of the last record.
func TestAOneShotSessionStartsOnePoolConnection(t *testing.T) {
	ctx := context.Background()
	dsn := withSchema(testDSN(t), newSchema(t))
	db, err := Connect(ctx, dsn) // creates the schema (on a connection it closes after)
	require.NoError(t, err)
	db.Close()
	db, err = Connect(ctx, dsn) // as the command's: the schema is there
	require.NoError(t, err)
	defer db.Close()
	s := db.Store("large").(*store)
	s.pub.large = 64 // every manifest of the run is larger
	// An idle timer that never fires stands for one armed already: no
	// idle write, even where the machine stalls the session longer than
	// viewsEvery (Close stops it).
	s.pub.idling.Add(1)
	s.pub.idle = time.NewTimer(time.Hour)
	r, err := runstate.OpenStore(s, t.TempDir(), &runstate.Options{Request: "one shot", ManifestInterval: time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, r.Skip(ctx, "a", "a record"))
	require.NoError(t, r.Close())
	assert.EqualValues(t, 1, db.pool.Stat().NewConnsCount(), "the pool's connections started")

	var seq, last int64
	var size int
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT p.seq, r.last_seq, length(p.manifest) FROM {s}.projections p JOIN {s}.runs r ON r.id = p.run_id WHERE r.name = 'large'`)).Scan(&seq, &last, &size))
	assert.Equal(t, last, seq, "the clean Close wrote the manifest of the last record")
	assert.Greater(t, size, 64)
}

// Against the server: with every manifest large, no transaction that
// appended records wrote a manifest (triggers note the transaction of
// each record and of each manifest written), manifests reach the
// projections row while the session runs (writes of their own), and a
// clean Close leaves the last one there.
func TestLargeManifestsAreWrittenApartFromTheRecords(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	_, err := db.pool.Exec(ctx, db.sql(`
CREATE TABLE {s}.xacts (tab text NOT NULL, xact text NOT NULL, size int);
CREATE FUNCTION {s}.note_xact() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_TABLE_NAME = 'records' THEN
    INSERT INTO {s}.xacts VALUES ('records', pg_current_xact_id()::text, NULL);
  ELSIF TG_OP = 'INSERT' OR NEW.manifest IS DISTINCT FROM OLD.manifest THEN
    INSERT INTO {s}.xacts VALUES ('manifest', pg_current_xact_id()::text, length(NEW.manifest));
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER note_xact AFTER INSERT ON {s}.records FOR EACH ROW EXECUTE FUNCTION {s}.note_xact();
CREATE TRIGGER note_xact AFTER INSERT OR UPDATE ON {s}.projections FOR EACH ROW EXECUTE FUNCTION {s}.note_xact()`))
	require.NoError(t, err)

	s := db.Store("large").(*store)
	s.pub.large = 64 // every manifest of a run is larger
	r, err := runstate.OpenStore(s, t.TempDir(), &runstate.Options{Request: "large manifests", ManifestInterval: time.Millisecond})
	require.NoError(t, err)
	count := func(q string) int {
		t.Helper()
		var n int
		require.NoError(t, db.pool.QueryRow(ctx, db.sql(q)).Scan(&n))
		return n
	}
	stage := 0
	require.Eventually(t, func() bool {
		for range 5 {
			stage++
			require.NoError(t, doOutput(ctx, r, fmt.Sprintf("s%d", stage)))
		}
		return count(`SELECT count(*) FROM {s}.xacts WHERE tab = 'manifest'`) >= 2
	}, 30*time.Second, 10*time.Millisecond, "manifests reach the database while the session runs")
	require.NoError(t, r.Close())

	assert.Zero(t, count(`SELECT count(*) FROM {s}.xacts m JOIN {s}.xacts r ON r.xact = m.xact AND r.tab = 'records' WHERE m.tab = 'manifest' AND m.size > 64`),
		"no transaction that appended records wrote a large manifest")
	var seq, last int64
	require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT p.seq, r.last_seq FROM {s}.projections p JOIN {s}.runs r ON r.id = p.run_id WHERE r.name = 'large'`)).Scan(&seq, &last))
	assert.Equal(t, last, seq, "a clean Close leaves the manifest of the last record")
}
