// Package kit holds what the bench programs share: the logical work of a
// checkpoint (the stage, its output file, the ~300-byte record) and the
// statistics of the reports (medians, quantiles, paired ratios).
package kit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"time"

	"github.com/runstate/runstate/internal/floorio"
)

// The logical work of one checkpoint is the same for every contender:
// a stage named StageName(id) finished and produced the small file
// OutputPath(id) with content OutputData(id); the checkpoint writes that
// file (atomically, without fsync, as runstate's Stage.WriteFile does) and
// durably records a ~300-byte record naming the stage, the output path, its
// sha256 and its size. runstate builds that record itself; the others build
// it with CheckpointRecord.

func StageName(id int) string { return fmt.Sprintf("s%08d", id) }

func OutputPath(id int) string { return fmt.Sprintf("artifacts/out-%08d.txt", id) }

// outputData is the content of the output file of checkpoint id (~160 bytes).
func OutputData(id int) []byte {
	b := make([]byte, 0, 192)
	b = append(b, "stage "...)
	b = append(b, StageName(id)...)
	b = append(b, " output\n"...)
	for i := 0; len(b) < 150; i++ {
		b = strconv.AppendInt(b, int64(id*31+i), 36)
		b = append(b, ' ')
	}
	return append(b, '\n')
}

// BenchSession stands in for the session id that runstate puts in each
// record, so the records are of the same size.
const BenchSession = "6f1c2b9e-3d4a-4f5b-8c7d-9e0a1b2c3d4e"

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

// CheckpointRecord returns the JSON record (no newline) describing the
// completed stage of checkpoint id, whose output is data.
func CheckpointRecord(id int, data []byte) []byte {
	sum := sha256.Sum256(data)
	r := record{
		Seq:     id + 1,
		At:      time.Now().UTC().Format(time.RFC3339Nano),
		Ev:      "complete",
		Session: BenchSession,
		Stage:   StageName(id),
		Attempt: 1,
		Outputs: []outputRec{{Path: OutputPath(id), SHA256: hex.EncodeToString(sum[:]), Size: len(data)}},
	}
	b, err := json.Marshal(r)
	if err != nil {
		panic(err) // a fixed struct of strings and ints always marshals
	}
	return b
}

// FileWork is the output-file half of a checkpoint for the contenders that
// are not runstate, written as runstate's Stage.WriteFile writes a new
// output (floorio.WriteOutput): on Linux an unnamed file made in the
// output's directory, written and linked in under its name (openat with
// O_TMPFILE, write, linkat, close); elsewhere, or where the file system
// cannot, a temp file created with O_EXCL in dir/tmp, written, closed and
// renamed to dir/OutputPath(id). Nothing is synced. It keeps both
// directories open, so that the contenders' file work costs no more than
// runstate's.
type FileWork struct {
	enabled  bool
	tmp, out *os.File // dir/tmp and the directory of outputPath
}

func NewFileWork(dir string, enabled bool) (FileWork, error) {
	fw := FileWork{enabled: enabled}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return fw, err
	}
	out := filepath.Join(dir, filepath.Dir(filepath.FromSlash(OutputPath(0))))
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

func (fw FileWork) Write(id int, data []byte) error {
	if !fw.enabled {
		return nil
	}
	return floorio.WriteOutput(fw.tmp, fw.out, fmt.Sprintf("%s-%08d", BenchSession, id), path.Base(OutputPath(id)), data)
}

func (fw FileWork) Close() {
	if fw.tmp != nil {
		fw.tmp.Close()
		fw.out.Close()
	}
}
