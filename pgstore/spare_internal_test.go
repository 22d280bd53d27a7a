package pgstore

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// backendApp is the application_name of the server process pid ("" when
// it is gone), read on db's pool.
func backendApp(t *testing.T, db *DB, pid uint32) string {
	t.Helper()
	var app string
	err := db.pool.QueryRow(context.Background(), "SELECT coalesce((SELECT application_name FROM pg_stat_activity WHERE pid = $1), '')", int64(pid)).Scan(&app)
	require.NoError(t, err)
	return app
}

// sparePID is the server process of db's spare lock connection (0: none).
func sparePID(db *DB) uint32 {
	db.spareMu.Lock()
	defer db.spareMu.Unlock()
	if db.spare == nil {
		return 0
	}
	return db.spare.conn.PgConn().PID()
}

// Connect makes two connections at once, the pool's and a lock
// connection, and the first session to open takes the lock connection:
// a program that connects and opens a run (the runstate command) starts
// two server connections one after the other's start, not three.
func TestTheFirstSessionTakesConnectsLockConnection(t *testing.T) {
	ctx := context.Background()
	dsn := withSchema(testDSN(t), newSchema(t))
	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer db.Close()
	pid := sparePID(db)
	require.NotZero(t, pid, "Connect keeps a lock connection")
	ro, err := ConnectReadOnly(ctx, dsn)
	require.NoError(t, err)
	assert.NotZero(t, sparePID(ro), "ConnectReadOnly too: the runstate command opens its sessions through it")
	ro.Close()
	assert.EqualValues(t, 1, db.pool.Stat().TotalConns(), "the pool's own: one")
	assert.Equal(t, "runstate spare", backendApp(t, db, pid))

	st := db.Store("r").(*store)
	run, err := runstate.OpenStore(st, t.TempDir(), &runstate.Options{Request: "spare"})
	require.NoError(t, err)
	defer run.Close()
	assert.Equal(t, pid, st.ses.current().PgConn().PID(), "the session's lock connection is the spare")
	assert.Equal(t, "runstate session", backendApp(t, db, pid))
	assert.Zero(t, sparePID(db), "taken")
	require.NoError(t, run.Skip(ctx, "a", "works"), "the session works on it")

	// A second session makes its own.
	st2 := db.Store("r2").(*store)
	run2, err := runstate.OpenStore(st2, t.TempDir(), &runstate.Options{Request: "spare"})
	require.NoError(t, err)
	defer run2.Close()
	assert.NotEqual(t, pid, st2.ses.current().PgConn().PID())
}

// An unused spare is closed after spareFor, and by Close.
func TestAnUnusedSpareIsClosed(t *testing.T) {
	ctx := context.Background()
	dsn := withSchema(testDSN(t), newSchema(t))
	watch, err := Connect(ctx, dsn)
	require.NoError(t, err)
	defer watch.Close()
	gone := func(pid uint32) bool {
		_, ok := poll(10*time.Second, 5*time.Millisecond, func() bool { return backendApp(t, watch, pid) == "" })
		return ok
	}

	db, err := Connect(ctx, dsn)
	require.NoError(t, err)
	pid := sparePID(db)
	require.NotZero(t, pid)
	db.Close()
	assert.True(t, gone(pid), "Close closes the spare")

	defer func(d time.Duration) { spareFor = d }(spareFor)
	// The spare's timer starts before Connect returns: on a loaded
	// machine it can fire before the spare is seen here. Then connect
	// again with twice the spareFor (the point is a spare seen, then
	// closed unused).
	var kept *spareConn // referenced: a connection dropped unclosed would be closed by the garbage collector
	for try := 0; ; try++ {
		spareFor = 50 * time.Millisecond << try
		db, err = Connect(ctx, dsn)
		require.NoError(t, err)
		db.spareMu.Lock()
		kept = db.spare
		db.spareMu.Unlock()
		if kept != nil || try == 4 {
			break
		}
		t.Logf("try %d: the spare was closed (after spareFor, %v) before it was seen: again", try, spareFor)
		db.Close()
	}
	defer db.Close()
	require.NotNil(t, kept, "Connect keeps a spare")
	pid = kept.conn.PgConn().PID()
	assert.True(t, gone(pid), "closed unused after spareFor")
	runtime.KeepAlive(kept)
	assert.Zero(t, sparePID(db))
	run, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "spare"})
	require.NoError(t, err, "a session then makes its own")
	require.NoError(t, run.Close())
}

// A spare whose server connection ended meanwhile (a server restarted,
// an administrator's pg_terminate_backend) is replaced by a new one: the
// session opens.
func TestADeadSpareIsReplaced(t *testing.T) {
	ctx := context.Background()
	db, err := Connect(ctx, withSchema(testDSN(t), newSchema(t)))
	require.NoError(t, err)
	defer db.Close()
	pid := sparePID(db)
	require.NotZero(t, pid)
	var ok bool
	require.NoError(t, db.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ok))
	require.True(t, ok)
	_, ok = poll(10*time.Second, 5*time.Millisecond, func() bool { return backendApp(t, db, pid) == "" })
	require.True(t, ok, "the spare's server process ended")

	st := db.Store("r").(*store)
	run, err := runstate.OpenStore(st, t.TempDir(), &runstate.Options{Request: "spare"})
	require.NoError(t, err)
	defer run.Close()
	assert.NotEqual(t, pid, st.ses.current().PgConn().PID())
	require.NoError(t, run.Skip(ctx, "a", "works"))
}
