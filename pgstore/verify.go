package pgstore

import (
	"context"
	"encoding/hex"
	"fmt"

	"github.com/runstate/runstate"
)

// VerifyStore adds the database's own checks to runstate.VerifyStore: the
// run's head row names its last record; every output row's blob is there
// with all its chunks and its size. It reads one snapshot, takes no lock
// and writes nothing; safe for concurrent use.
func (s *store) VerifyStore(ctx context.Context) ([]runstate.Problem, error) {
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
	rows, err := tx.Query(ctx, s.db.sql(`SELECT o.seq, o.path, o.sha256, b.size IS NULL, coalesce(b.size, 0), o.size,
		coalesce(b.chunks, 0), (SELECT count(*) FROM {s}.blob_chunks c WHERE c.sha256 = o.sha256),
		(SELECT coalesce(sum(length(c.data)), 0) FROM {s}.blob_chunks c WHERE c.sha256 = o.sha256)
		FROM {s}.outputs o LEFT JOIN {s}.blobs b ON b.sha256 = o.sha256 WHERE o.run_id = $1 ORDER BY o.seq, o.path`), runID)
	if err != nil {
		return nil, s.db.rightsError("verify the outputs of run "+s.name, err)
	}
	defer rows.Close()
	for rows.Next() {
		var seq, blobSize, size, chunkBytes int64
		var chunks, haveChunks int
		var path string
		var sum []byte
		var missing bool
		if err := rows.Scan(&seq, &path, &sum, &missing, &blobSize, &size, &chunks, &haveChunks, &chunkBytes); err != nil {
			return nil, err
		}
		what := ""
		switch {
		case missing:
			what = "its blob is missing from " + s.db.schema + ".blobs"
		case blobSize != size:
			what = fmt.Sprintf("its blob has %d bytes, the record says %d", blobSize, size)
		case haveChunks != chunks || chunkBytes != blobSize:
			what = fmt.Sprintf("its blob has %d of %d chunks, %d of %d bytes", haveChunks, chunks, chunkBytes, blobSize)
		}
		if what != "" {
			probs = append(probs, runstate.Problem{File: file,
				What: fmt.Sprintf("output %s (sha256 %x) of record %d: %s", path, sum, seq, what),
				Fix:  "invalidate the stage that made it (runstate invalidate) so that it runs again"})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.db.rightsError("verify the outputs of run "+s.name, err)
	}
	return probs, nil
}
