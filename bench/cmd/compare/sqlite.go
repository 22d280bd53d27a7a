package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"time"

	"github.com/runstate/runstate/bench/internal/kit"

	_ "modernc.org/sqlite" // registers database/sql driver "sqlite"
)

// sqliteWAL records each checkpoint as one autocommit INSERT into a SQLite
// database in WAL mode with synchronous=FULL (the WAL is fsync'd at every
// commit). The pool has a single connection, the usual setup for writing
// to SQLite from Go: SQLite admits one writer at a time anyway, and a
// single connection queues concurrent writers in Go instead of making them
// spin in SQLite's sleeping busy handler.
type sqliteWAL struct {
	fw  kit.FileWork
	db  *sql.DB
	ins *sql.Stmt
}

func init() {
	register(contenderInfo{
		name:  "sqlite",
		order: 20,
		about: "modernc.org/sqlite, WAL, synchronous=FULL, one INSERT per checkpoint, 1 connection",
		make:  func() contender { return &sqliteWAL{} },
	})
}

func (c *sqliteWAL) Open(ctx context.Context, dir string) error {
	fw, err := kit.NewFileWork(dir, writeOutputs)
	if err != nil {
		return err
	}
	c.fw = fw
	dsn := "file:" + filepath.Join(dir, "checkpoints.db") +
		"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)"
	c.db, err = sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	c.db.SetMaxOpenConns(1)
	if _, err := c.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS checkpoints (
		stage  TEXT PRIMARY KEY,
		record BLOB NOT NULL
	)`); err != nil {
		return err
	}
	var mode string
	if err := c.db.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
		return err
	}
	var syncMode int
	if err := c.db.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncMode); err != nil {
		return err
	}
	if mode != "wal" || syncMode != 2 {
		return fmt.Errorf("sqlite: journal_mode=%s synchronous=%d, want wal and 2 (FULL)", mode, syncMode)
	}
	c.ins, err = c.db.PrepareContext(ctx, `INSERT INTO checkpoints (stage, record) VALUES (?, ?)`)
	return err
}

func (c *sqliteWAL) Checkpoints(ctx context.Context, first, n int, lat []time.Duration) error {
	for k := range n {
		id := first + k
		t0 := time.Now()
		data := kit.OutputData(id)
		if err := c.fw.Write(id, data); err != nil {
			return err
		}
		if _, err := c.ins.ExecContext(ctx, kit.StageName(id), kit.CheckpointRecord(id, data)); err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}

func (c *sqliteWAL) Close() error {
	c.fw.Close()
	c.ins.Close()
	return c.db.Close()
}
