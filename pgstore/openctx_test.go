package pgstore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Open's context bounds its waits: for the run's lock, which a session
// that has the run alone holds exclusive (held here by a bare connection,
// as a frozen session would), and for the run's head row, which another
// session's batch holds. A wait that runs out leaves nothing behind: no
// lock, no waiting backend, no sessions row.
func TestOpenContextBoundsItsWaits(t *testing.T) {
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, conn *pgx.Conn, db *DB, runID string) (release func())
	}{
		{"run lock", func(t *testing.T, conn *pgx.Conn, db *DB, runID string) func() {
			_, err := conn.Exec(context.Background(), "SELECT pg_advisory_lock($1)", runKey(runID))
			require.NoError(t, err)
			return func() { _, _ = conn.Exec(context.Background(), "SELECT pg_advisory_unlock_all()") }
		}},
		{"head row", func(t *testing.T, conn *pgx.Conn, db *DB, runID string) func() {
			ctx := context.Background()
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, db.sql("SELECT 1 FROM {s}.runs WHERE id = $1 FOR NO KEY UPDATE"), runID)
			require.NoError(t, err)
			return func() { _ = tx.Rollback(ctx) }
		}},
		{"run row FOR UPDATE", func(t *testing.T, conn *pgx.Conn, db *DB, runID string) func() {
			ctx := context.Background() // a person's lock: the session's row (a foreign key) waits for it
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, db.sql("SELECT 1 FROM {s}.runs WHERE id = $1 FOR UPDATE"), runID)
			require.NoError(t, err)
			return func() { _ = tx.Rollback(ctx) }
		}},
	} {
		for _, deadline := range []bool{true, false} {
			name := tc.name + "/deadline"
			if !deadline {
				name = tc.name + "/cancel"
			}
			t.Run(name, func(t *testing.T) {
				db := newTestDB(t)
				ctx := context.Background()
				opts := &runstate.Options{Request: "bounded open"}
				r, err := db.Open(ctx, "r", t.TempDir(), opts)
				require.NoError(t, err)
				require.NoError(t, r.Close())
				var runID string
				require.NoError(t, db.pool.QueryRow(ctx, db.sql(`SELECT id::text FROM {s}.runs WHERE name = 'r'`)).Scan(&runID))

				conn, err := pgx.Connect(ctx, testDSN(t))
				require.NoError(t, err)
				defer conn.Close(ctx)
				release := tc.hold(t, conn, db, runID)
				released := false
				defer func() {
					if !released {
						release()
					}
				}()

				// The checks below read the server on a connection of their
				// own, connected beforehand: a pool connection made for them
				// (a new backend) took long enough to hide a backend that
				// was still waiting when Open returned.
				watch, err := pgx.Connect(ctx, testDSN(t))
				require.NoError(t, err)
				defer watch.Close(ctx)
				holder := conn.PgConn().PID()
				// waiting counts the backends waiting for a lock the holder
				// holds.
				waiting := func() int {
					var n int
					require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
						holder).Scan(&n))
					return n
				}

				// Open's context ends while Open waits for the holder's lock,
				// not before it got there (its connection and session take
				// longer than 300 ms on a loaded machine): a cancel comes once
				// a backend is seen waiting; a deadline that ended Open before
				// any was seen is tried again, twice as long, up to 5 times.
				type result struct {
					r   *runstate.Run
					err error
					at  time.Time // when Open returned
				}
				var res result
				var ctxEnd time.Time // when Open's context ended
				for try, d := 0, 300*time.Millisecond; ; try, d = try+1, 2*d {
					octx, cancel := context.WithTimeout(ctx, d)
					if !deadline {
						octx, cancel = context.WithCancel(ctx)
					}
					start := time.Now()
					ctxEnd = start.Add(d)
					done := make(chan result, 1)
					go func() {
						r, err := db.Open(octx, "r", t.TempDir(), opts)
						done <- result{r, err, time.Now()}
					}()
					seen, ended := false, false
					for !seen && !ended {
						select {
						case res = <-done:
							ended = true
						default:
							if waiting() > 0 {
								seen = true
								if !deadline {
									ctxEnd = time.Now()
									cancel()
								}
							} else if time.Since(start) > 10*time.Second {
								cancel()
								res = <-done
								if res.r != nil {
									_ = res.r.Close()
								}
								t.Fatalf("Open was not seen waiting for the %s in 10 s (it returned %v)", tc.name, res.err)
							} else {
								time.Sleep(time.Millisecond)
							}
						}
					}
					if !ended {
						select {
						case res = <-done:
						case <-time.After(5 * time.Second):
							release() // let the Open end, so that the test does
							released = true
							res = <-done
							if res.r != nil {
								_ = res.r.Close()
							}
							cancel()
							t.Fatalf("Open waited past its context's end for 5 s (it returned %v once the %s was let go)", res.err, tc.name)
						}
					}
					cancel()
					if seen || !deadline || res.err == nil || try == 4 {
						require.True(t, seen, "Open ended (%v) before it was seen waiting for the %s", res.err, tc.name)
						break
					}
					t.Logf("try %d: the %v deadline ended Open before it waited for the %s (%v): again with %v", try, d, tc.name, res.err, 2*d)
					require.Zero(t, waiting(), "backends still waiting for a lock the holder holds")
					require.Zero(t, sessionRows(t, db), "sessions rows")
				}
				require.Error(t, res.err)
				assert.Less(t, res.at.Sub(ctxEnd), 1200*time.Millisecond, "Open returned within about a second of its context's end")
				if deadline {
					assert.ErrorIs(t, res.err, context.DeadlineExceeded)
					assert.ErrorIs(t, res.err, runstate.ErrLockTimeout)
				} else {
					assert.ErrorIs(t, res.err, context.Canceled)
				}
				assert.Contains(t, res.err.Error(), "nothing was recorded")
				t.Log(res.err)

				// Nothing left behind, at once: no lock or waiting backend but
				// the holder's on the run's keys, no sessions row.
				var others int
				require.NoError(t, watch.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid <> $1
				AND objsubid = 1 AND (classid::bigint << 32 | objid::bigint) = ANY($2::bigint[])`,
					conn.PgConn().PID(), []int64{runKey(runID), wantKey(runID)}).Scan(&others))
				assert.Zero(t, others, "advisory locks (held or awaited) on the run's keys by other backends than the holder's")
				assert.Zero(t, waiting(), "backends still waiting for a lock the holder holds")
				assert.Zero(t, sessionRows(t, db), "sessions rows")

				// Once the holder lets go, the run opens as before.
				release()
				released = true
				r, err = db.Open(ctx, "r", t.TempDir(), opts)
				require.NoError(t, err)
				require.NoError(t, r.Close())
			})
		}
	}
}
