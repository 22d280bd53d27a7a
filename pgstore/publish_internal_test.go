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

// A large manifest never rides in a batch's commit: the batch's take
// starts a write of its own instead, once, and gets nothing, not even a
// handoff that is due, while that write is under way; the write takes the
// manifest and the handoff. The next large manifest waits largePace times
// as long as that write took (take leaves it kept, due says the Run need
// not render one), and then starts a write of its own again. A small one
// goes with the batch as before.
func TestLargeManifestGoesByAWriteOfItsOwn(t *testing.T) {
	// An idle timer that never fires stands for one armed already, so
	// that no idle write (armLocked) takes anything meanwhile.
	p := &published{large: 10, idle: time.NewTimer(time.Hour)}
	defer p.idle.Stop()
	started := make(chan bool, 4)
	release := make(chan struct{})
	type took struct{ manifest, handoff *projection }
	wrote := make(chan took, 4)
	p.write = func(start bool) {
		started <- start
		<-release
		require.True(t, p.startOwn(start))
		t0 := time.Now()
		m, h := p.take(time.Now(), false, false)
		wrote <- took{m, h}
		p.endOwn(p.largeOne(m), t0.Add(-time.Second)) // as if it took a second
	}
	at := func(seq int64) runstate.Position { return runstate.Position{Seq: seq} }
	large := []byte(strings.Repeat("m", 100))

	p.keep(at(1), large, []byte("handoff 1"))
	m, h := p.take(time.Now(), false, true)
	assert.Nil(t, m, "a batch takes no large manifest")
	assert.Nil(t, h, "nor the handoff, which goes with the manifest's own write")
	require.True(t, <-started, "the batch's take started a write of its own, marked under way")
	p.keep(at(2), nil, []byte("handoff 2"))
	m, h = p.take(time.Now(), false, true)
	assert.Nil(t, m)
	assert.Nil(t, h, "while a write of its own is under way, a batch leaves the projections row to it")
	assert.False(t, p.startOwn(false), "an idle write finds it under way and leaves")
	close(release)
	got := <-wrote
	require.NotNil(t, got.manifest, "the write of its own took the manifest")
	assert.Equal(t, int64(1), got.manifest.at.Seq)
	require.NotNil(t, got.handoff, "and the handoff")
	assert.Equal(t, "handoff 2", string(got.handoff.data))
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return !p.own
	}, 5*time.Second, time.Millisecond)

	p.mu.Lock()
	after, cost := p.largeAfter, p.largeCost
	p.mu.Unlock()
	assert.GreaterOrEqual(t, cost, time.Second, "the write's time")
	assert.WithinDuration(t, time.Now().Add(largePace*cost), after, 5*time.Second, "the next large manifest waits largePace times as long")
	manifestDue, _ := p.due(time.Now())
	assert.False(t, manifestDue, "the Run need not render a large manifest before its pace allows")

	p.keep(at(3), large, nil)
	m, _ = p.take(time.Now(), false, true)
	assert.Nil(t, m, "a large manifest before its pace allows stays kept")
	select {
	case <-started:
		t.Fatal("a write of its own started before the pace allowed")
	default:
	}
	m, _ = p.take(time.Now(), false, false)
	assert.Nil(t, m, "an idle write leaves it too")

	manifestDue, _ = p.due(after)
	assert.True(t, manifestDue, "due once the pace allows")
	p.mu.Lock()
	p.largeAfter = time.Now() // as if the pace's time had passed
	p.mu.Unlock()
	m, _ = p.take(time.Now(), false, true)
	assert.Nil(t, m)
	require.True(t, <-started, "once the pace allows, a batch's take starts a write of its own again")
	got = <-wrote
	require.NotNil(t, got.manifest)
	assert.Equal(t, int64(3), got.manifest.at.Seq)
	p.idling.Wait()

	p.keep(at(4), []byte("small"), nil)
	m, _ = p.take(time.Now(), false, true)
	require.NotNil(t, m, "a small manifest goes with the batch, pace or not")
	assert.Equal(t, "small", string(m.data))

	p.keep(at(5), large, nil)
	m, _ = p.take(time.Now(), true, false)
	require.NotNil(t, m, "a clean Close's write takes a large manifest whatever the pace")
	assert.Equal(t, int64(5), m.at.Seq)
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
