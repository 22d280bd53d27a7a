package pgstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/runstate/runstate"
)

// chunkSize is the size of one blob_chunks row.
const chunkSize = 1 << 20

// MaxBlob caps one output's size in the database (default 256 MiB, kept
// in 1 MiB chunks): a larger output is refused (runstate.ErrInvalid), as
// pgstore keeps outputs nowhere else. Set it before Connect;
// changing it while runs are open is a data race.
var MaxBlob int64 = 256 << 20

// inlineMax is the size up to which a blob rides in a batch's
// transaction instead of one of its own: in the row of each output of the
// batch that names it (queueWrites), else in blobs.
const inlineMax = 64 << 10

// blobStore keeps outputs content-addressed in blobs and blob_chunks,
// shared by every run of the schema. Safe for concurrent use.
type blobStore struct {
	db *DB
	s  *store // the session's store: its batches carry small blobs

	mu      sync.Mutex
	pending []inlineBlob // Put, not yet committed with a batch
}

// inlineBlob is a small blob waiting for a batch that carries it (take).
type inlineBlob struct {
	sum  []byte
	data []byte
}

// take hands a batch the pending small blobs it carries: every one when
// all (a synchronous batch: Put promises them to it), else only those
// whose sha256 is in named, the batch's outputs' (a lazy batch: with 8
// goroutines on one run, the batch of their begins that the committer
// sends while their completes queue took those completes' bytes, which
// then went to blobs and blob_chunks, two statements more, instead of
// into the completes' rows: a third of the outputs).
func (b *blobStore) take(named [][]byte, all bool) []inlineBlob {
	b.mu.Lock()
	defer b.mu.Unlock()
	if all {
		p := b.pending
		b.pending = nil
		return p
	}
	var took, rest []inlineBlob
	for _, p := range b.pending {
		if slices.ContainsFunc(named, func(sum []byte) bool { return bytes.Equal(sum, p.sum) }) {
			took = append(took, p)
		} else {
			rest = append(rest, p)
		}
	}
	b.pending = rest
	return took
}

// putBack returns the small blobs of a batch that did not commit.
func (b *blobStore) putBack(p []inlineBlob) {
	if len(p) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pending = append(p, b.pending...)
}

// insertOneBlobSQL stores one small blob: its one chunk, then its row.
// The row's INSERT reads from c, so that c runs first: a data-modifying
// CTE that nothing reads runs after the main statement, and this one
// would then insert the row before the chunk, the other way round from
// every other writer of blobs (chunks, then rows, each in hash order:
// queueInline), and so deadlock with a batch storing the same blobs (seen
// in TestSessionsShareARunAtAnyDefaultIsolation: 40P01 between this and
// the two statements of several blobs).
//
// Bytes held already are replaced where they differ (runstate.Blobs.Put:
// a put repairs damaged bytes), as putChunkSQL and putBlobSQL do.
const insertOneBlobSQL = `WITH c AS (
  INSERT INTO {s}.blob_chunks (sha256, n, data) VALUES ($1, 0, $2)
  ON CONFLICT (sha256, n) DO UPDATE SET data = excluded.data WHERE blob_chunks.data IS DISTINCT FROM excluded.data RETURNING 1
)
INSERT INTO {s}.blobs (sha256, size, chunks) SELECT $1, $3, 1 FROM (SELECT count(*) FROM c) c
ON CONFLICT (sha256) DO UPDATE SET size = excluded.size, chunks = excluded.chunks WHERE (blobs.size, blobs.chunks) IS DISTINCT FROM (excluded.size, excluded.chunks)`

// queueInline queues the inserts of small blobs into a batch's round trip,
// in the order of their hashes: an optimistic batch inserts its blobs
// before it locks the head row (the outputs' foreign key needs them
// first), so that two batches storing the same blobs could otherwise each
// wait for the other's uncommitted insert of one (a deadlock).
func (b *blobStore) queueInline(pb *pgx.Batch, blobs []inlineBlob) {
	slices.SortFunc(blobs, func(x, y inlineBlob) int { return bytes.Compare(x.sum, y.sum) })
	// Once each: goroutines that wrote the same bytes put them each, and
	// an ON CONFLICT DO UPDATE may not meet one row twice (21000).
	blobs = slices.CompactFunc(blobs, func(x, y inlineBlob) bool { return bytes.Equal(x.sum, y.sum) })
	switch len(blobs) {
	case 0:
		return
	case 1: // the common case (a checkpoint's one output): one statement, no arrays
		x := blobs[0]
		pb.Queue(b.db.sql(insertOneBlobSQL), x.sum, x.data, int64(len(x.data)))
		return
	}
	sums := make([][]byte, len(blobs))
	datas := make([][]byte, len(blobs))
	sizes := make([]int64, len(blobs))
	for i, x := range blobs {
		sums[i], datas[i], sizes[i] = x.sum, x.data, int64(len(x.data))
	}
	pb.Queue(b.db.sql(`INSERT INTO {s}.blob_chunks (sha256, n, data) SELECT s, 0, d FROM unnest($1::bytea[], $2::bytea[]) u(s, d)
ON CONFLICT (sha256, n) DO UPDATE SET data = excluded.data WHERE blob_chunks.data IS DISTINCT FROM excluded.data`), pgtype.FlatArray[[]byte](sums), pgtype.FlatArray[[]byte](datas))
	pb.Queue(b.db.sql(`INSERT INTO {s}.blobs (sha256, size, chunks) SELECT s, n, 1 FROM unnest($1::bytea[], $2::bigint[]) u(s, n)
ON CONFLICT (sha256) DO UPDATE SET size = excluded.size, chunks = excluded.chunks WHERE (blobs.size, blobs.chunks) IS DISTINCT FROM (excluded.size, excluded.chunks)`), pgtype.FlatArray[[]byte](sums), sizes)
}

// Missing returns those of sha256s (hex) that the database does not hold
// as blobs. Bytes held only in an outputs row (a small output, schema
// version 4) count as missing: a record that names them without a Put
// would need a blob row for its output's key unless a row of its own
// batch holds them, so the caller Puts them again (idempotent; small).
func (b *blobStore) Missing(ctx context.Context, sha256s []string) ([]string, error) {
	sums := make([][]byte, 0, len(sha256s))
	for _, s := range sha256s {
		sum, err := decodeSum(s)
		if err != nil {
			return nil, err
		}
		sums = append(sums, sum)
	}
	var held [][]byte
	err := retryConn(ctx, func() error { // a read: again after a restart
		rows, err := b.db.pool.Query(ctx, b.db.sql(`SELECT sha256 FROM {s}.blobs WHERE sha256 = ANY($1)`), sums)
		if err != nil {
			return err
		}
		held, err = pgx.CollectRows(rows, pgx.RowTo[[]byte])
		return err
	})
	if err != nil {
		return nil, b.db.rightsError("look up blobs", err)
	}
	have := map[string]bool{}
	b.mu.Lock()
	for _, p := range b.pending {
		have[hex.EncodeToString(p.sum)] = true
	}
	b.mu.Unlock()
	for _, sum := range held {
		have[hex.EncodeToString(sum)] = true
	}
	var missing []string
	for _, s := range sha256s {
		if !have[s] {
			missing = append(missing, s)
			have[s] = true // once
		}
	}
	return missing, nil
}

func decodeSum(s string) ([]byte, error) {
	sum, err := hex.DecodeString(s)
	if err != nil || len(sum) != sha256.Size {
		return nil, fmt.Errorf("%w: %q is not a hex SHA-256", runstate.ErrInvalid, s)
	}
	return sum, nil
}

// Put stores r's bytes as the blob sum (hex) of size bytes. r must yield
// exactly size bytes hashing to sum, or nothing is stored. Put is
// idempotent; chunks held under sum already are replaced by these where
// they differ (damaged: a Get found them not hashing to sum, and the Run
// puts the bytes again). A blob of at most 64 KiB, put by a session, is written with
// the first of that session's batches that either records an output of
// those bytes or commits synchronously (the one that records the output,
// or an earlier one), in its transaction: no round trip of its own, and
// never a record without its bytes. A larger one goes in 1 MiB chunks in a
// transaction of its own, committed with synchronous_commit off: the
// record that names it commits synchronously after it, and WAL is flushed
// in order, so the blob is durable when that record is (a departure from
// runstate.Blobs' "durably when it returns" that no record can observe).
func (b *blobStore) Put(ctx context.Context, sum string, size int64, r io.Reader) error {
	want, err := decodeSum(sum)
	if err != nil {
		return err
	}
	if size > MaxBlob {
		return fmt.Errorf("%w: an output of %d bytes is more than the %d bytes pgstore keeps in the database (pgstore.MaxBlob)", runstate.ErrInvalid, size, MaxBlob)
	}
	if size <= inlineMax && b.s != nil && b.s.opened() {
		data, err := readExactly(sum, size, r)
		if err != nil {
			return err
		}
		b.mu.Lock()
		b.pending = append(b.pending, inlineBlob{sum: want, data: data})
		b.mu.Unlock()
		return nil
	}
	if size <= chunkSize {
		return b.putSmall(ctx, sum, want, size, r)
	}
	tx, err := b.db.pool.BeginTx(ctx, readCommitted)
	if err != nil {
		return b.db.connectError(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
		return b.db.connectError(err)
	}
	if _, err := tx.Exec(ctx, noTimeoutsSQL); err != nil {
		return b.db.connectError(err)
	}
	h := sha256.New()
	buf := make([]byte, chunkSize)
	var n int64
	chunks := 0
	for {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			h.Write(buf[:k])
			n += int64(k)
			if n > size {
				return fmt.Errorf("pgstore: blob %s: more than its %d bytes (the file changed while it was stored?)", sum, size)
			}
			if _, err := tx.Exec(ctx, b.db.sql(putChunkSQL), want, chunks, buf[:k]); err != nil {
				return b.db.rightsError("store blob "+sum, err)
			}
			chunks++
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("pgstore: blob %s: %w", sum, err)
		}
	}
	if n != size || hex.EncodeToString(h.Sum(nil)) != sum {
		return fmt.Errorf("pgstore: blob %s: got %d bytes with another hash (the file changed while it was stored?); nothing was stored", sum, n)
	}
	if _, err := tx.Exec(ctx, b.db.sql(putBlobSQL), want, size, chunks); err != nil {
		return b.db.rightsError("store blob "+sum, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return b.db.connectError(err)
	}
	return nil
}

// A Put replaces the bytes a blob holds already (runstate.Blobs: a put of
// bytes found damaged repairs them), within the transaction whose commit
// follows the check of the new bytes' hash; putBlobSQL drops chunks past
// the new count (damaged bytes of another size).
const (
	putChunkSQL = `INSERT INTO {s}.blob_chunks (sha256, n, data) VALUES ($1, $2, $3)
ON CONFLICT (sha256, n) DO UPDATE SET data = excluded.data WHERE blob_chunks.data IS DISTINCT FROM excluded.data`
	putBlobSQL = `WITH past AS (DELETE FROM {s}.blob_chunks WHERE sha256 = $1 AND n >= $3)
INSERT INTO {s}.blobs (sha256, size, chunks) VALUES ($1, $2, $3)
ON CONFLICT (sha256) DO UPDATE SET size = excluded.size, chunks = excluded.chunks WHERE (blobs.size, blobs.chunks) IS DISTINCT FROM (excluded.size, excluded.chunks)`
)

// putSmall stores a blob of one chunk in one round trip.
func (b *blobStore) putSmall(ctx context.Context, sum string, want []byte, size int64, r io.Reader) error {
	data, err := readExactly(sum, size, r)
	if err != nil {
		return err
	}
	// Idempotent: again after a restart (a pgx.Batch of its own each
	// time: a sent one is not sent again as it was).
	err = retryConn(ctx, func() error {
		var pb pgx.Batch
		pb.Queue(beginSQL)
		pb.Queue("SET LOCAL synchronous_commit = off")
		pb.Queue(noTimeoutsSQL)
		pb.Queue(b.db.sql(putChunkSQL), want, 0, data)
		pb.Queue(b.db.sql(putBlobSQL), want, size, 1)
		pb.Queue("COMMIT")
		return b.db.pool.SendBatch(ctx, &pb).Close()
	})
	if err != nil {
		return b.db.rightsError("store blob "+sum, err)
	}
	return nil
}

// readExactly reads a small blob whole and checks it.
func readExactly(sum string, size int64, r io.Reader) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, size+1))
	if err != nil {
		return nil, fmt.Errorf("pgstore: blob %s: %w", sum, err)
	}
	if h := sha256.Sum256(data); int64(len(data)) != size || hex.EncodeToString(h[:]) != sum {
		return nil, fmt.Errorf("pgstore: blob %s: got %d bytes with another hash (the file changed while it was stored?); nothing was stored", sum, len(data))
	}
	return data, nil
}

// Get streams the blob sum (hex), one chunk per query, checking its hash
// at the end: a reader that ends without error got exactly the stored
// bytes. A small output's bytes are in its outputs row (schema version 4,
// queueWrites), where no blobs row holds them; Get reads such a row first
// when there is one (the database checked its hash). A blob the database lacks
// is an error wrapping fs.ErrNotExist.
func (b *blobStore) Get(ctx context.Context, sum string) (io.ReadCloser, error) {
	want, err := decodeSum(sum)
	if err != nil {
		return nil, err
	}
	var size int64
	var chunks int
	var data []byte
	// An outputs row first: the database checked its bytes' hash
	// (outputs_data_sum), where a blob's chunks may have been damaged
	// since they were put.
	err = retryConn(ctx, func() error { // a read: again after a restart
		return b.db.pool.QueryRow(ctx, b.db.sql(`(SELECT size, 0, data FROM {s}.outputs WHERE sha256 = $1 AND data IS NOT NULL LIMIT 1)
		UNION ALL SELECT size, chunks, NULL FROM {s}.blobs WHERE sha256 = $1 LIMIT 1`), want).Scan(&size, &chunks, &data)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgstore: blob %s is neither in %s.blobs nor in an outputs row: %w", sum, b.db.schema, errNotExist)
	} else if err != nil {
		return nil, b.db.rightsError("read blob "+sum, err)
	}
	r := &blobReader{b: b, ctx: ctx, sum: sum, want: want, size: size, chunks: chunks, h: sha256.New(), where: b.db.schema + ".blob_chunks"}
	if data != nil {
		r.where = "an outputs row of " + b.db.schema
		r.buf, r.got = data, int64(len(data))
		r.h.Write(data)
	}
	return r, nil
}

type blobReader struct {
	b      *blobStore
	ctx    context.Context
	sum    string
	want   []byte
	size   int64
	chunks int
	next   int
	got    int64
	buf    []byte
	h      hash.Hash
	err    error
	where  string // where the bytes are, for errors
}

// damagedBytes is the error for stored bytes that are not the ones their
// sum names: errors.Is(err, runstate.ErrCorrupt) holds, as Blobs.Get
// promises, but its text says that the output's stored bytes are damaged,
// not the ledger (whose records are whole).
type damagedBytes struct{ what string }

func (e *damagedBytes) Error() string        { return "runstate: stored output bytes are damaged: " + e.what }
func (e *damagedBytes) Is(target error) bool { return target == runstate.ErrCorrupt }

func (r *blobReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		if r.next == r.chunks {
			if r.got != r.size || hex.EncodeToString(r.h.Sum(nil)) != r.sum {
				r.err = &damagedBytes{fmt.Sprintf("blob %s in %s has %d bytes with another hash", r.sum, r.where, r.got)}
			} else {
				r.err = io.EOF
			}
			continue
		}
		var data []byte
		err := retryConn(r.ctx, func() error {
			return r.b.db.pool.QueryRow(r.ctx, r.b.db.sql(`SELECT data FROM {s}.blob_chunks WHERE sha256 = $1 AND n = $2`), r.want, r.next).Scan(&data)
		})
		if err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				err = &damagedBytes{fmt.Sprintf("blob %s lacks chunk %d in %s.blob_chunks", r.sum, r.next, r.b.db.schema)}
			}
			r.err = err
			continue
		}
		r.next++
		r.got += int64(len(data))
		r.h.Write(data)
		r.buf = data
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *blobReader) Close() error { return nil }

var errNotExist = fs.ErrNotExist
