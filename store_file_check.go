package runstate

import (
	"errors"
	"io/fs"
	"os"
)

// fileIDs are the files a session appends to, as it opened them: the
// ledger and the journal. Under the ledger lock, checkFile (the ledger,
// before a batch's fsync) and checkJournal look whether their names still lead to them: a ledger or a
// journal deleted, renamed or replaced under a session (by a person, a
// backup tool, a sync client) would otherwise take its appends and
// fdatasyncs into a file nobody reads again, and records acknowledged
// after that would be lost.
type fileIDs struct {
	ledger, wal fileID
}

// fileID identifies an open file: device and inode where the system has
// them (statx on Linux: it asks for no times, so it does not make the next
// append update the inode's times, which a stat would since Linux 6.13:
// see fileSize), or the FileInfo for os.SameFile. The zero fileID (a file
// of a test's file system) is not checked.
type fileID struct {
	dev, ino uint64
	fi       fs.FileInfo
}

// errReplaced is what checkFile reports for a file that is not the one
// the session has open.
var errReplaced = errors.New("it is no longer the file this session opened (deleted, renamed or replaced?)")

// checkBatch is the check of the ledger for a batch that acknowledges a
// record durably (one that asks for an fsync: a Complete, an Effect's
// intent, a Close ...): Batch.Sync runs it under the ledger lock, before
// any of the batch's records is acknowledged: one statx (or lstat). A
// batch of begins alone, which acknowledges nothing durably, is not
// checked: the complete after it is. The journal is checked only when a
// batch is to be made durable in it: one made durable by the ledger's own
// fdatasync does not depend on it.
//
// A statx walks a path: 2-3 µs each on the development machine. Running
// the checks on a goroutine beside the batch's fsync, to hide that, was
// measured slower (perfreport, alternating rounds: a checkpoint without an
// output 1.59x the raw floor against 1.49x inline): the goroutine's start
// and wake-up cost more than the statx.
func (s *dirStore) checkBatch() error { return s.checkFile(ledgerFile, s.ids.ledger) }

// checkJournal is checkFile for logs/ledger.wal, for a batch that the
// ring alone will hold durably (syncBatch checks it before writing the
// ring).
func (s *dirStore) checkJournal() error { return s.checkFile(walFile, s.ids.wal) }

// checkFile reports, as a sticky WriteError naming the file, a file (rel,
// opened as id) whose path no longer leads to the file the session
// appends to (see checkBatch).
func (s *dirStore) checkFile(rel string, id fileID) error {
	if id == (fileID{}) {
		return nil
	}
	same, err := s.pathIs(rel, id)
	if err == nil && same {
		return nil // every batch: no path joined for an error not made
	}
	if err == nil || isNotExist(err) {
		err = errReplaced
	}
	return &WriteError{Path: s.path(rel), Op: "check", Sticky: true, Err: err}
}

// statFileID is fileID by Stat, for os.SameFile.
func statFileID(f file) (fileID, error) {
	of, ok := f.(osFile)
	if !ok {
		return fileID{}, nil
	}
	fi, err := of.Stat()
	if err != nil {
		return fileID{}, err
	}
	return fileID{fi: fi}, nil
}

// lstatIs reports whether path, not followed if it is a link, is the
// file id was taken from (statFileID).
func lstatIs(path string, id fileID) (bool, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return false, err
	}
	return os.SameFile(fi, id.fi), nil
}
