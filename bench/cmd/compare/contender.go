package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/runstate/runstate/internal/floorio"
)

// A contender is one way of durably recording checkpoints. Each contender
// gets its own directory, opened once per run and used for every round.
type contender interface {
	// Open creates the store in dir (an empty directory).
	Open(ctx context.Context, dir string) error
	// Checkpoints performs n checkpoints, one after another, for the ids
	// first, first+1, … first+n-1, and stores the latency of checkpoint k
	// in lat[k]. It is called from several goroutines at once in the
	// concurrent mode (with disjoint ids), so it must be safe for that.
	Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error
	// Close releases the store.
	Close() error
}

// A contenderInfo describes one contender for -contenders and the table.
type contenderInfo struct {
	name  string
	order int // table order: the floor first
	about string
	make  func() contender
	// optional contenders run only when named in -contenders.
	optional bool
}

var registry = map[string]contenderInfo{}

func register(ci contenderInfo) {
	if _, dup := registry[ci.name]; dup {
		panic("duplicate contender " + ci.name)
	}
	registry[ci.name] = ci
}

// registered returns every contender, in table order.
func registered() []contenderInfo {
	var all []contenderInfo
	for _, ci := range registry {
		all = append(all, ci)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].order < all[j].order })
	return all
}

// The logical work of one checkpoint is the same for every contender:
// a stage named stageName(id) finished and produced the small file
// outputPath(id) with content outputData(id); the checkpoint writes that
// file (atomically, without fsync, as runstate's Stage.WriteFile does) and
// durably records a ~300-byte record naming the stage, the output path, its
// sha256 and its size. runstate builds that record itself; the others build
// it with checkpointRecord.

func stageName(id int) string { return fmt.Sprintf("s%08d", id) }

func outputPath(id int) string { return fmt.Sprintf("artifacts/out-%08d.txt", id) }

// outputData is the content of the output file of checkpoint id (~160 bytes).
func outputData(id int) []byte {
	b := make([]byte, 0, 192)
	b = append(b, "stage "...)
	b = append(b, stageName(id)...)
	b = append(b, " output\n"...)
	for i := 0; len(b) < 150; i++ {
		b = strconv.AppendInt(b, int64(id*31+i), 36)
		b = append(b, ' ')
	}
	return append(b, '\n')
}

// benchSession stands in for the session id that runstate puts in each
// record, so the records are of the same size.
const benchSession = "6f1c2b9e-3d4a-4f5b-8c7d-9e0a1b2c3d4e"

type outputRec struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int    `json:"size"`
}

type record struct {
	Seq     int         `json:"seq,omitempty"`
	At      string      `json:"at"`
	Ev      string      `json:"ev"`
	Session string      `json:"session"`
	Stage   string      `json:"stage"`
	Attempt int         `json:"attempt"`
	Outputs []outputRec `json:"outputs"`
}

// checkpointRecord returns the JSON record (no newline) describing the
// completed stage of checkpoint id, whose output is data.
func checkpointRecord(id int, data []byte) []byte {
	sum := sha256.Sum256(data)
	r := record{
		Seq:     id + 1,
		At:      time.Now().UTC().Format(time.RFC3339Nano),
		Ev:      "complete",
		Session: benchSession,
		Stage:   stageName(id),
		Attempt: 1,
		Outputs: []outputRec{{Path: outputPath(id), SHA256: hex.EncodeToString(sum[:]), Size: len(data)}},
	}
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a fixed struct of strings and ints always marshals
	}
	return b
}

// fileWork is the output-file half of a checkpoint for the contenders that
// are not runstate, written as runstate's Stage.WriteFile writes a new
// output (floorio.WriteOutput): on Linux an unnamed file made in the
// output's directory, written and linked in under its name (openat with
// O_TMPFILE, write, linkat, close); elsewhere, or where the file system
// cannot, a temp file created with O_EXCL in dir/tmp, written, closed and
// renamed to dir/outputPath(id). Nothing is synced. It keeps both
// directories open, so that the contenders' file work costs no more than
// runstate's.
type fileWork struct {
	enabled  bool
	tmp, out *os.File // dir/tmp and the directory of outputPath
}

func newFileWork(dir string) (fileWork, error) {
	fw := fileWork{enabled: writeOutputs}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return fw, err
	}
	out := filepath.Join(dir, filepath.Dir(filepath.FromSlash(outputPath(0))))
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fw, err
	}
	var err error
	if fw.tmp, err = os.Open(filepath.Join(dir, "tmp")); err != nil {
		return fw, err
	}
	if fw.out, err = os.Open(out); err != nil {
		fw.tmp.Close()
		return fw, err
	}
	return fw, nil
}

func (fw fileWork) write(id int, data []byte) error {
	if !fw.enabled {
		return nil
	}
	return floorio.WriteOutput(fw.tmp, fw.out, fmt.Sprintf("%s-%08d", benchSession, id), path.Base(outputPath(id)), data)
}

func (fw fileWork) close() {
	if fw.tmp != nil {
		fw.tmp.Close()
		fw.out.Close()
	}
}
