package pgstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/runstate/runstate"
)

// VerifyStore adds the database's own checks to runstate.VerifyStore: the
// run's head row names its last record; every output row holds bytes that
// hash to its sha256 (a small output, schema version 4), or its blob is
// there with all its chunks and its size. It reads one snapshot, takes no lock
// and writes nothing; safe for concurrent use.
func (s *store) VerifyStore(ctx context.Context) ([]runstate.Problem, error) {
	return s.verify(ctx, false)
}

// rehashing is the store whose VerifyStore also rereads and rehashes every
// blob (RehashBlobs).
type rehashing struct{ *store }

func (r rehashing) VerifyStore(ctx context.Context) ([]runstate.Problem, error) {
	return r.store.verify(ctx, true)
}

// VerifyOption changes what DB.Verify checks.
type VerifyOption func(*verifyOptions)

type verifyOptions struct{ rehash bool }

// RehashBlobs makes DB.Verify also read every blob that an output of the
// run references, chunk by chunk, and check its bytes against the sha256
// it is stored under and its size: a blob whose bytes were altered in
// blob_chunks, or lack a chunk, is reported with the outputs that need it.
// It reads each distinct blob once: its cost grows with the bytes the
// run's outputs hold (measured: pgstore/README.md). Like Verify, it
// writes nothing; safe for concurrent use.
func RehashBlobs() VerifyOption { return func(o *verifyOptions) { o.rehash = true } }

// verify is VerifyStore; rehash: RehashBlobs.
func (s *store) verify(ctx context.Context, rehash bool) ([]runstate.Problem, error) {
	runID, err := s.id(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := s.db.pool.Begin(ctx)
	if err != nil {
		return nil, s.db.connectError(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"); err != nil {
		return nil, s.db.connectError(err)
	}
	var probs []runstate.Problem
	file := s.String()
	var headSeq, lastSeq int64
	var headHash, lastHash []byte
	err = tx.QueryRow(ctx, s.db.sql(`SELECT r.last_seq, r.last_hash, coalesce(l.seq, 0), coalesce(l.hash, '')
		FROM {s}.runs r LEFT JOIN LATERAL (SELECT seq, hash FROM {s}.records WHERE run_id = r.id ORDER BY seq DESC LIMIT 1) l ON true
		WHERE r.id = $1`), runID).Scan(&headSeq, &headHash, &lastSeq, &lastHash)
	if err != nil {
		return nil, s.db.rightsError("verify run "+s.name, err)
	}
	if headSeq != lastSeq || hex.EncodeToString(headHash) != hex.EncodeToString(lastHash) {
		probs = append(probs, runstate.Problem{File: file,
			What: fmt.Sprintf("the head row (%s.runs) names record %d, but the last record is %d (or its hash differs)", s.db.schema, headSeq, lastSeq),
			Fix:  "the tables were edited by hand: restore them from a backup"})
	}
	rows, err := tx.Query(ctx, s.db.sql(`SELECT o.seq, o.path, o.sha256, o.data IS NOT NULL,
		coalesce(length(o.data) = o.size AND pg_catalog.sha256(o.data) = o.sha256, false), b.size IS NULL, coalesce(b.size, 0), o.size,
		coalesce(b.chunks, 0), (SELECT count(*) FROM {s}.blob_chunks c WHERE c.sha256 = o.sha256),
		(SELECT coalesce(sum(length(c.data)), 0) FROM {s}.blob_chunks c WHERE c.sha256 = o.sha256),
		coalesce((SELECT r.stage FROM {s}.records r WHERE r.run_id = o.run_id AND r.seq = o.seq), '')
		FROM {s}.outputs o LEFT JOIN {s}.blobs b ON b.sha256 = o.sha256 WHERE o.run_id = $1 ORDER BY o.seq, o.path`), runID)
	if err != nil {
		return nil, s.db.rightsError("verify the outputs of run "+s.name, err)
	}
	defer rows.Close()
	var whole []output // the outputs whose blob looks whole, to rehash
	for rows.Next() {
		var o output
		var blobSize, chunkBytes int64
		var chunks, haveChunks int
		var sum []byte
		var inline, inlineOK, missing bool
		if err := rows.Scan(&o.seq, &o.path, &sum, &inline, &inlineOK, &missing, &blobSize, &o.size, &chunks, &haveChunks, &chunkBytes, &o.stage); err != nil {
			return nil, err
		}
		o.sum = hex.EncodeToString(sum)
		what, fix := "", fmt.Sprintf("invalidate the stage that made it (runstate invalidate %s %s) so that it runs again and stores its output anew", shellArg(s.Address()), o.stage)
		switch {
		case inline && inlineOK: // its bytes are in its row, and hash to it
		case inline:
			what = "the bytes in its outputs row are not the ones its sha256 and size name (" + s.db.schema + ".outputs was edited with its check outputs_data_sum dropped?)"
			fix = fmt.Sprintf("restore %s.outputs from a backup, or %s", s.db.schema, fix)
		case missing:
			what = "its blob is missing from " + s.db.schema + ".blobs, and its outputs row does not hold its bytes"
		case blobSize != o.size:
			what = fmt.Sprintf("its blob has %d bytes, the record says %d", blobSize, o.size)
		case haveChunks != chunks || chunkBytes != blobSize:
			what = fmt.Sprintf("its blob has %d of %d chunks, %d of %d bytes", haveChunks, chunks, chunkBytes, blobSize)
			fix = s.damagedFix(o) // the blobs row stands: a redo stores nothing again
		default:
			whole = append(whole, o)
		}
		if what != "" {
			probs = append(probs, runstate.Problem{File: file, What: o.describe(what), Fix: fix})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.db.rightsError("verify the outputs of run "+s.name, err)
	}
	rows.Close()
	if rehash {
		more, err := s.rehash(ctx, whole)
		if err != nil {
			return nil, err
		}
		probs = append(probs, more...)
	}
	return probs, nil
}

// output is one row of the outputs table, with its record's stage.
type output struct {
	seq         int64
	stage, path string
	sum         string // hex
	size        int64
}

func (o output) describe(what string) string {
	return fmt.Sprintf("output %s of stage %s (record %d, sha256 %s): %s", o.path, o.stage, o.seq, o.sum, what)
}

// rehash reads each distinct blob of outs through Blobs.Get, which checks
// every chunk is there and the bytes' sha256 and size, and reports every
// output whose blob fails.
func (s *store) rehash(ctx context.Context, outs []output) ([]runstate.Problem, error) {
	bad := map[string]error{}
	checked := map[string]bool{}
	for _, o := range outs {
		if checked[o.sum] {
			continue
		}
		checked[o.sum] = true
		rc, err := s.blobs.Get(ctx, o.sum)
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		switch {
		case errors.Is(err, runstate.ErrCorrupt), errors.Is(err, fs.ErrNotExist):
			bad[o.sum] = err
		case err != nil:
			return nil, s.db.rightsError("read the blobs of run "+s.name, err)
		}
	}
	var probs []runstate.Problem
	for _, o := range outs {
		err := bad[o.sum]
		if err == nil {
			continue
		}
		why := err.Error()
		if d, ok := errors.AsType[*damagedBytes](err); ok {
			why = d.what
		}
		probs = append(probs, runstate.Problem{File: s.String(),
			What: o.describe("its stored bytes do not match it: " + why),
			Fix:  s.damagedFix(o)})
	}
	return probs, nil
}

// damagedFix is what to do about an output whose blob row stands but
// whose chunks are damaged: a session that meets them restoring the
// output runs its stage again and stores the bytes anew (the Run puts
// what it found damaged, and Put replaces the chunks). A redo for another
// reason (an invalidate) does not: Blobs.Missing goes by the blobs row.
func (s *store) damagedFix(o output) string {
	return fmt.Sprintf("no machine can restore this output from the database until its bytes are good again: run stage %s in a working directory without %s "+
		"(its restore finds these bytes damaged, so the stage runs again, and its Complete stores them anew when it makes the same bytes); "+
		"or restore %s.blob_chunks from a backup",
		o.stage, o.path, s.db.schema)
}

// shellArg quotes an address for a shell command line (its query's & and ?).
func shellArg(s string) string {
	if !strings.ContainsAny(s, "&?;|*[] '\"$`\\") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
