//go:build ignore

// gen_fixtures writes the ledger fixtures in testdata/. The tests read them
// as they are checked in: regenerate only when the format changes on
// purpose (a new format version gets new files; old ones stay).
//
//	go run testdata/gen_fixtures.go
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log"
	"os"
	"path/filepath"

	"github.com/runstate/runstate"
)

func main() {
	log.SetFlags(0)
	if err := basic(); err != nil {
		log.Fatal(err)
	}
	// foreign.jsonl: written by "another tool" or a later version: fields
	// in any order, unknown fields and events, times with a UTC offset and
	// without fractions. Readers must accept all of it.
	foreign := []string{
		`{"prev":"","data":{"format":1,"request":"fixture: foreign writer","id":"01890a5d-ac96-774b-bcce-b302099a8057","x-future":{"nested":[1,2,3]}},"ev":"create","at":"2025-03-01T10:00:00+02:00","seq":1,"session":"01890a5d-ac96-774b-bcce-b30209900001"}`,
		`{"ev":"open","seq":2,"at":"2025-03-01T08:00:01Z","session":"01890a5d-ac96-774b-bcce-b30209900001","data":{"pid":4242,"host":"elsewhere","cpu":"riscv"},"prev":"PREV"}`,
		`{"seq":3,"data":["fetch","build"],"ev":"plan","at":"2025-03-01T08:00:02.5Z","session":"01890a5d-ac96-774b-bcce-b30209900001","prev":"PREV","x-tool":"planner 9"}`,
		`{"at":"2025-03-01T08:00:03Z","seq":4,"ev":"begin","stage":"fetch","attempt":1,"session":"01890a5d-ac96-774b-bcce-b30209900001","inputs":{"url":"sha256:0000000000000000000000000000000000000000000000000000000000000001"},"prev":"PREV"}`,
		`{"seq":5,"ev":"telemetry","at":"2025-03-01T08:00:04Z","session":"01890a5d-ac96-774b-bcce-b30209900001","cpu_ms":12,"prev":"PREV"}`,
		`{"outputs":[{"size":2,"sha256":"ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb","path":"artifacts/fetch.txt","mode":"0644"}],"ev":"complete","stage":"fetch","attempt":1,"seq":6,"at":"2025-03-01T09:00:05.123456789+01:00","session":"01890a5d-ac96-774b-bcce-b30209900001","inputs":{"url":"sha256:0000000000000000000000000000000000000000000000000000000000000001"},"prev":"PREV"}`,
		`{"seq":7,"ev":"close","at":"2025-03-01T08:00:06Z","session":"01890a5d-ac96-774b-bcce-b30209900001","prev":"PREV"}`,
	}
	if err := writeChained("testdata/foreign.jsonl", foreign); err != nil {
		log.Fatal(err)
	}
	// format2.jsonl: a run written in a format this version does not know.
	format2 := []string{
		`{"seq":1,"at":"2030-01-01T00:00:00Z","ev":"create","session":"01890a5d-ac96-774b-bcce-b30209900002","data":{"id":"01890a5d-ac96-774b-bcce-b302099a8058","request":"fixture: from the future","format":2},"prev":""}`,
		`{"seq":2,"at":"2030-01-01T00:00:01Z","ev":"open","session":"01890a5d-ac96-774b-bcce-b30209900002","data":{"pid":1},"prev":"PREV"}`,
	}
	if err := writeChained("testdata/format2.jsonl", format2); err != nil {
		log.Fatal(err)
	}
}

// writeChained writes lines, replacing each "PREV" with the hash of the
// line before.
func writeChained(path string, lines []string) error {
	var buf bytes.Buffer
	prev := ""
	for _, l := range lines {
		l = string(bytes.Replace([]byte(l), []byte(`"prev":"PREV"`), []byte(`"prev":"`+prev+`"`), 1))
		if !json.Valid([]byte(l)) {
			return errors.New("invalid JSON: " + l)
		}
		buf.WriteString(l)
		buf.WriteByte('\n')
		h := sha256.Sum256([]byte(l))
		prev = hex.EncodeToString(h[:])
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// basic writes basic.jsonl with this version of the library: a run with a
// plan, a completed stage, a failure and a retry, a skip, and two
// sessions. torn.jsonl is the same with half a record after it.
func basic() error {
	dir, err := os.MkdirTemp("", "runstate-fixture")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	opts := &runstate.Options{Request: "fixture: build the report", Revision: "abc123", Environment: map[string]string{"env": "test"}}
	r, err := runstate.Open(dir, opts)
	if err != nil {
		return err
	}
	if err := r.Plan(ctx, "fetch", "build", "deploy"); err != nil {
		return err
	}
	if err := r.Do(ctx, "fetch", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/fetch.txt", []byte("fetched\n"))
	}, runstate.Value("url", "https://example.com/data")); err != nil {
		return err
	}
	if err := r.Do(ctx, "build", func(ctx context.Context, st *runstate.Stage) error {
		return errors.New("compiler crashed")
	}, runstate.After("fetch")); err == nil {
		return errors.New("build should fail")
	}
	if err := r.Close(); err != nil {
		return err
	}
	opts.Revision = "def456"
	if r, err = runstate.Open(dir, opts); err != nil {
		return err
	}
	if err := r.Do(ctx, "build", func(ctx context.Context, st *runstate.Stage) error {
		return st.WriteFile("artifacts/report.md", []byte("# report\n"))
	}, runstate.After("fetch")); err != nil {
		return err
	}
	if err := r.Skip(ctx, "deploy", "dry run"); err != nil {
		return err
	}
	if err := r.Close(); err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(dir, "logs", "ledger.jsonl"))
	if err != nil {
		return err
	}
	if err := os.WriteFile("testdata/basic.jsonl", data, 0o644); err != nil {
		return err
	}
	torn := append(data, []byte(`{"seq":14,"at":"2025-03-01T08:00:06Z","ev":"open","sess`)...)
	return os.WriteFile("testdata/torn.jsonl", torn, 0o644)
}
