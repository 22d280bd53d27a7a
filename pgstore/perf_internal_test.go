package pgstore

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/runstate/runstate"
)

// The benchmarks of pgstore: each needs a server (RUNSTATE_PG_DSN, as the
// tests: skipped without one, a failure under CI), and none runs in
// 'go test' without -bench. Each times its operation against one raw
// INSERT transaction of a ~300-byte row with synchronous_commit on, on the
// same server, in alternating rounds (the raw one off the clock), and
// reports the medians and their ratio beside ns/op: on a loaded machine
// the absolute figures swing, the ratios much less.
//
//	cd pgstore && ./testdb.sh go test -run '^$' -bench . -benchtime 2000x .

// median and p99 of a sample (sorted in place).
func median[T cmp.Ordered](d []T) T       { slices.Sort(d); return d[len(d)/2] }
func p99(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)*99/100] }

// newRawInsert makes the baseline: each call is one INSERT transaction of
// a ~300-byte row on a connection of its own, timed.
func newRawInsert(b *testing.B, db *DB) func() time.Duration {
	ctx := context.Background()
	if _, err := db.pool.Exec(ctx, db.sql(`CREATE TABLE {s}.raw (id bigserial PRIMARY KEY, line bytea NOT NULL)`)); err != nil {
		b.Fatal(err)
	}
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Release)
	row := []byte(strings.Repeat("x", 300))
	q := db.sql(`INSERT INTO {s}.raw (line) VALUES ($1)`)
	return func() time.Duration {
		start := time.Now()
		if _, err := conn.Exec(ctx, q, row); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
}

// report adds the medians and the ratio to the benchmark's figures.
func report(b *testing.B, op, raw []time.Duration) {
	if len(op) == 0 || len(raw) == 0 {
		return
	}
	m, r := median(op), median(raw)
	b.ReportMetric(float64(m.Nanoseconds()), "median-ns")
	b.ReportMetric(float64(p99(op).Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(r.Nanoseconds()), "raw-median-ns")
	b.ReportMetric(float64(m)/float64(r), "x-raw")
}

// checkpointer does one checkpoint of a run per call: Do with one small
// output, on ten stages each redone with a new input value, so that the
// run's size stays that of a real run (the handoff and the state are
// O(stages)).
func checkpointer(b *testing.B, r *runstate.Run) func() time.Duration {
	ctx := context.Background()
	k := 0
	return func() time.Duration {
		k++
		name := fmt.Sprintf("s%d", k%10)
		start := time.Now()
		err := r.Do(ctx, name, func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile("out/"+name+".txt", []byte(fmt.Sprintf("result %d\n", k)))
		}, runstate.Value("round", k))
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
}

// BenchmarkCheckpoint is one checkpoint through DB.Open's Run per op (its
// begin, its complete, the local output, the working directory's views).
// Off the clock, each op also times a raw INSERT transaction and the same
// checkpoint on a Run opened with runstate.OpenStore, which writes no
// views: noviews-median-ns is what the views cost (the three alternate,
// and which checkpoint goes first alternates too).
func BenchmarkCheckpoint(b *testing.B) {
	db := newTestDB(b)
	ctx := context.Background()
	raw := newRawInsert(b, db)
	r, err := db.Open(ctx, "perf", b.TempDir(), &runstate.Options{Request: "perf"})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	plain, err := runstate.OpenStore(db.Store("perf-noviews"), b.TempDir(), &runstate.Options{Request: "perf"})
	if err != nil {
		b.Fatal(err)
	}
	defer plain.Close()
	cp, cpPlain := checkpointer(b, r), checkpointer(b, plain)
	var raws, cps, plains []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		raws = append(raws, raw())
		if i%2 == 0 { // which goes first alternates too
			plains = append(plains, cpPlain())
		}
		b.StartTimer()
		cps = append(cps, cp())
		b.StopTimer()
		if i%2 == 1 {
			plains = append(plains, cpPlain())
		}
		b.StartTimer()
	}
	b.StopTimer()
	report(b, cps, raws)
	b.ReportMetric(float64(median(plains).Nanoseconds()), "noviews-median-ns")
}

// BenchmarkStoreAppend is one of the store's own append batches per op
// (one record: Lock, Tail, Append, Sync or not, Unlock), without the Run:
// synced is a complete's batch (COMMIT with synchronous_commit on), lazy
// a begin's (synchronous_commit off).
func BenchmarkStoreAppend(b *testing.B) {
	for _, sync := range []bool{true, false} {
		name := "lazy"
		if sync {
			name = "synced"
		}
		b.Run(name, func(b *testing.B) {
			db := newTestDB(b)
			ctx := context.Background()
			raw := newRawInsert(b, db)
			st := db.Store("r")
			session := newSessionID()
			if _, _, err := st.Open(ctx, session); err != nil {
				b.Fatal(err)
			}
			defer st.Close(true)
			var pos runstate.Position
			var raws, ops []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				raws = append(raws, raw())
				b.StartTimer()
				start := time.Now()
				pos = appendLines(b, st, pos, session, 1, sync)
				ops = append(ops, time.Since(start))
			}
			b.StopTimer()
			report(b, ops, raws)
		})
	}
}

// BenchmarkVerify is one DB.Verify per op of a run with four outputs of
// 1 MiB + 12 KiB each (4.2 MB of blobs, two chunks each): records checks
// the records and the outputs' rows, rehash-blobs also reads and rehashes
// every blob (RehashBlobs; its MB/s is the bytes rehashed).
func BenchmarkVerify(b *testing.B) {
	db := newTestDB(b)
	ctx := context.Background()
	r, err := db.Open(ctx, "r", b.TempDir(), &runstate.Options{Request: "verify cost"})
	if err != nil {
		b.Fatal(err)
	}
	big := bigOutput()
	var bytes int64
	for i := range 4 { // each its own bytes
		data := append([]byte{byte(i)}, big...)
		bytes += int64(len(data))
		if err := r.Do(ctx, fmt.Sprintf("s%d", i), func(ctx context.Context, st *runstate.Stage) error {
			return st.WriteFile("out/big.bin", data)
		}); err != nil {
			b.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		b.Fatal(err)
	}
	for _, rehash := range []bool{false, true} {
		name, opts := "records", []VerifyOption(nil)
		if rehash {
			name, opts = "rehash-blobs", []VerifyOption{RehashBlobs()}
		}
		b.Run(name, func(b *testing.B) {
			if rehash {
				b.SetBytes(bytes)
			}
			for i := 0; i < b.N; i++ {
				rep, err := db.Verify(ctx, "r", opts...)
				if err != nil {
					b.Fatal(err)
				}
				if len(rep.Problems) > 0 {
					b.Fatalf("a clean run has problems: %v", rep.Problems)
				}
			}
		})
	}
}

// explicitBetSQL is the statement of the bet's lock and fence as it was
// before the bet's commit became one statement (BenchmarkBetCommit's
// baseline).
const explicitBetSQL = `SELECT 1 / count(*)::int, sqrt(min(CASE WHEN pg_try_advisory_xact_lock_shared($4) THEN -1 ELSE 1 END))
FROM (SELECT FROM {s}.runs WHERE id = $1 AND last_seq = $2 AND last_hash = $3 FOR NO KEY UPDATE NOWAIT) h`

// BenchmarkBetCommit is an optimistic batch's commit of one ~300-byte
// record (Append, then Sync: a complete's; or Confirm: a begin's), one
// implicit transaction of one statement, paired op by op (which goes
// first alternating) with the explicit transaction it replaced, the same
// batch as BEGIN; the bet's lock and fence (explicitBetSQL); [the blob];
// the locked append statement; [SET LOCAL synchronous_commit = off];
// COMMIT; and a raw INSERT transaction off the clock. median-ns is the
// implicit one's, explicit-median-ns the other's, x-explicit their ratio:
// the pairing cancels most of a shared machine's drift. "output" is a
// complete whose record names a new ~100-byte output (Put first: its
// blob rides in the batch), in three ways: the bet with the bytes in the
// output's row (median-ns: schema version 4), the bet storing them in
// blobs and blob_chunks by a statement of its own before the append
// (separate-median-ns, x-separate: how outputs were stored before), and
// the explicit one (blobs too).
func BenchmarkBetCommit(b *testing.B) {
	// Never alone: a session alone sends its bets of begins ahead on its
	// pipeline, and the explicit transactions on the pool would then race
	// them (a run of more than a second failed with 22012).
	old := solo
	solo = false
	b.Cleanup(func() { solo = old })
	for _, c := range []struct {
		name         string
		sync, output bool
	}{{"synced", true, false}, {"lazy", false, false}, {"output", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			db := newTestDB(b)
			raw := newRawInsert(b, db)
			s, session, at := openBetting(b, db, "bet")
			pad := strings.Repeat("x", 200)
			k := 0
			// one commits a batch: explicit, or a bet (own: with the
			// output's bytes in its row, inlineOutputs).
			one := func(explicit, own bool) time.Duration {
				ob, ok := s.LockOptimistic(at)
				if !ok {
					b.Fatal("the store does not bet")
				}
				bb := ob.(betBatch).batch
				var outs []runstate.Output
				if c.output {
					k++
					data := []byte(fmt.Sprintf("output %d of the benchmark, %s", k, pad[:60]))
					sum := sha256.Sum256(data)
					o := runstate.Output{Path: "out/o", SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
					if err := s.Blobs().Put(ctx, o.SHA256, o.Size, bytes.NewReader(data)); err != nil {
						b.Fatal(err)
					}
					outs = append(outs, o)
				}
				line := fmt.Sprintf(`{"seq":%d,"ev":"note","session":%q,"note":%q,"prev":%q}`, at.Seq+1, session, pad, at.Hash)
				to := runstate.Position{Seq: at.Seq + 1, Hash: lineHash([]byte(line)), End: at.End + int64(len(line)+1), LastLen: int64(len(line) + 1)}
				inlineOutputs = own
				start := time.Now()
				err := bb.Append([]*runstate.Record{{Seq: to.Seq, At: bb.Now(), Ev: "note", Session: session, Outputs: outs}}, []byte(line+"\n"), to)
				switch {
				case err != nil:
				case explicit:
					pb, _ := bb.commitBatch(!c.sync)
					hash, _ := hex.DecodeString(at.Hash)
					pb.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: "BEGIN"},
						{SQL: db.sql(explicitBetSQL), Arguments: []any{bb.runID, at.Seq, hash, bb.ses.key}}}, pb.QueuedQueries...)
					var conn *pgxpool.Conn
					if conn, err = db.pool.Acquire(ctx); err == nil {
						err = conn.SendBatch(ctx, pb).Close()
						conn.Release()
						bb.committed()
						bb.synced = true
					}
				case c.sync:
					err = ob.Sync(ctx)
				default:
					err = ob.Confirm(ctx)
				}
				d := time.Since(start)
				inlineOutputs = true
				if err == nil {
					err = ob.Unlock()
				}
				if err != nil {
					b.Fatal(err)
				}
				at = to
				return d
			}
			var raws, ops, explicit, separate []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				raws = append(raws, raw())
				if i%2 == 0 {
					explicit = append(explicit, one(true, false))
					if c.output {
						separate = append(separate, one(false, false))
					}
				}
				b.StartTimer()
				ops = append(ops, one(false, true))
				b.StopTimer()
				if i%2 == 1 {
					if c.output {
						separate = append(separate, one(false, false))
					}
					explicit = append(explicit, one(true, false))
				}
				b.StartTimer()
			}
			b.StopTimer()
			report(b, ops, raws)
			b.ReportMetric(float64(median(explicit).Nanoseconds()), "explicit-median-ns")
			b.ReportMetric(float64(median(ops))/float64(median(explicit)), "x-explicit")
			if c.output {
				b.ReportMetric(float64(median(separate).Nanoseconds()), "separate-median-ns")
				b.ReportMetric(float64(median(ops))/float64(median(separate)), "x-separate")
			}
		})
	}
}
