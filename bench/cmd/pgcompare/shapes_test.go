package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/runstate/runstate/bench/internal/kit"
)

// BenchmarkBeginShapes asks what a checkpoint's begin costs when it is
// committed apart from its complete, with bare INSERTs (no chain, no
// fence, no library): the question behind holding a short stage's begin
// back and committing it with the complete in one transaction. Each op
// runs four shapes, in an order rotated by the op, on one connection, each
// around the same output file (kit.FileWork):
//
//   - raw: one INSERT, synchronous_commit on (no file);
//   - ahead: the begin's INSERT with synchronous_commit off sent without
//     waiting for its reply, the file, then the complete's INSERT, and
//     both replies read (pgstore's shape for a session alone on its run);
//   - awaited: the same with the begin's reply read before the file
//     (twotx's shape; pgstore's when other sessions share the run);
//   - merged: the file, then one INSERT of both rows, synchronous.
//
// It reports each shape's median and its median ratio to raw
// (ahead-x-raw …): merged-x-raw minus ahead-x-raw is what a held begin
// could save at most.
//
//	cd bench && RUNSTATE_PG_DSN=… go test -run '^$' -bench BeginShapes -benchtime 2000x ./cmd/pgcompare
func BenchmarkBeginShapes(b *testing.B) {
	dsn := os.Getenv("RUNSTATE_PG_DSN")
	if dsn == "" {
		b.Skip("RUNSTATE_PG_DSN is not set")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	schema := pgx.Identifier{fmt.Sprintf("pgcb_shapes_%d", time.Now().UnixNano()%1e12)}.Sanitize()
	table := schema + ".records"
	b.Cleanup(func() {
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			b.Error(err)
		}
		conn.Close(ctx)
	})
	for _, q := range []string{
		"CREATE SCHEMA " + schema,
		"CREATE TABLE " + table + " (run text NOT NULL, seq bigint NOT NULL, line bytea NOT NULL, PRIMARY KEY (run, seq))",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	fw, err := kit.NewFileWork(filepath.Join(b.TempDir(), "work"), true)
	if err != nil {
		b.Fatal(err)
	}
	defer fw.Close()
	pc := conn.PgConn()
	prepare := func(name, q string) *pgconn.StatementDescription {
		sd, err := pc.Prepare(ctx, name, strings.ReplaceAll(q, "{t}", table), nil)
		if err != nil {
			b.Fatal(err)
		}
		return sd
	}
	syncIns := prepare("sync", "INSERT INTO {t} (run, seq, line) VALUES ('bench', $1, $2)")
	lazyIns := prepare("lazy", "WITH s AS (SELECT set_config('synchronous_commit', 'off', true)) INSERT INTO {t} (run, seq, line) SELECT 'bench', $1, $2 FROM s")
	twoIns := prepare("two", "INSERT INTO {t} (run, seq, line) VALUES ('bench', $1, $2), ('bench', $3, $4)")

	var seq int64
	next := func() ([]byte, int, []byte) {
		seq++
		id := int(seq)
		return []byte(fmt.Sprint(seq)), id, kit.CheckpointRecord(id, kit.OutputData(id))
	}
	// send queues one statement and its Sync; its parameters are pairs of
	// a seq (text) and a line (binary bytea).
	send := func(p *pgconn.Pipeline, sd *pgconn.StatementDescription, params ...[]byte) {
		formats := make([]int16, len(params))
		for i := range params {
			formats[i] = int16(i % 2)
		}
		p.SendQueryStatement(sd, params, formats, nil)
		if err := p.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	read := func(p *pgconn.Pipeline) {
		for _, want := range []string{"result", "sync"} {
			res, err := p.GetResults()
			if err != nil {
				b.Fatal(err)
			}
			switch r := res.(type) {
			case *pgconn.ResultReader:
				if _, err := r.Close(); err != nil {
					b.Fatal(err)
				}
				if want != "result" {
					b.Fatalf("a result where a Sync was due")
				}
			case *pgconn.PipelineSync:
				if want != "sync" {
					b.Fatalf("a Sync where a result was due")
				}
			default:
				b.Fatalf("a %T", res)
			}
		}
	}
	end := func(p *pgconn.Pipeline) {
		if err := p.Close(); err != nil {
			b.Fatal(err)
		}
	}
	work := func(id int) {
		if err := fw.Write(id, kit.OutputData(id)); err != nil {
			b.Fatal(err)
		}
	}
	shapes := []struct {
		name string
		run  func()
	}{
		{"raw", func() {
			s, _, line := next()
			p := pc.StartPipeline(ctx)
			send(p, syncIns, s, line)
			read(p)
			end(p)
		}},
		{"ahead", func() {
			s1, id, line := next()
			p := pc.StartPipeline(ctx)
			send(p, lazyIns, s1, line)
			work(id)
			s2, _, line2 := next()
			send(p, syncIns, s2, line2)
			read(p)
			read(p)
			end(p)
		}},
		{"awaited", func() {
			s1, id, line := next()
			p := pc.StartPipeline(ctx)
			send(p, lazyIns, s1, line)
			read(p)
			work(id)
			s2, _, line2 := next()
			send(p, syncIns, s2, line2)
			read(p)
			end(p)
		}},
		{"merged", func() {
			s1, id, line := next()
			work(id)
			s2, _, line2 := next()
			p := pc.StartPipeline(ctx)
			send(p, twoIns, s1, line, s2, line2)
			read(p)
			end(p)
		}},
	}
	lat := make([][]time.Duration, len(shapes))
	ratios := make([][]float64, len(shapes))
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		var took [4]time.Duration
		for k := range shapes {
			j := (i + k) % len(shapes)
			t0 := time.Now()
			shapes[j].run()
			took[j] = time.Since(t0)
		}
		for j := range shapes {
			lat[j] = append(lat[j], took[j])
			ratios[j] = append(ratios[j], float64(took[j])/float64(took[0]))
		}
	}
	b.StopTimer()
	for j, s := range shapes {
		b.ReportMetric(float64(kit.Median(lat[j])), s.name+"-median-ns")
		if j > 0 {
			b.ReportMetric(kit.MedianF(ratios[j]), s.name+"-x-raw")
		}
	}
}
