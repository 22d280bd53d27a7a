package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/runstate/runstate/bench/internal/kit"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	_ "github.com/dbos-inc/dbos-transact-golang/dbos/driver/sqlite" // SQLite system database
)

// dbosTransact runs DBOS Transact Go with a SQLite system database. A
// checkpoint is one DBOS step (dbos.RunAsStep) that writes the output file
// and returns the record as its output; DBOS stores the step's output in
// its system database (one write transaction, committed durably) before
// RunAsStep returns: that is DBOS's checkpoint. Each call of Checkpoints is
// one workflow that runs n such steps, so the per-workflow rows (start, end)
// are outside the per-op latencies but inside the throughput figures.
//
// The system database is a *sql.DB opened here with the settings DBOS's own
// OpenSQLitePool uses (WAL, busy_timeout 5000, foreign_keys, _txlock=immediate,
// at most 8 connections) except synchronous=FULL instead of DBOS's default
// NORMAL: with NORMAL a WAL commit is not fsync'd and can be lost at power
// failure, which no other contender allows itself. DBOS leaves the PRAGMAs
// of a handle passed as Config.SQLiteSystemDB to its owner.
type dbosTransact struct {
	db *sql.DB
	d  *kit.DBOS
}

func init() {
	register(contenderInfo{
		name:  "dbos",
		order: 40,
		about: "DBOS Transact Go, SQLite system DB (WAL, synchronous=FULL), one RunAsStep per checkpoint",
		make:  func() contender { return &dbosTransact{} },
	})
}

func (c *dbosTransact) Open(ctx context.Context, dir string) error {
	fw, err := kit.NewFileWork(dir, writeOutputs)
	if err != nil {
		return err
	}
	dsn := "file:" + filepath.Join(dir, "dbos.sqlite") + "?_txlock=immediate" +
		"&_pragma=busy_timeout(5000)&_pragma=foreign_keys(ON)" +
		"&_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)"
	c.db, err = sql.Open("sqlite", dsn)
	if err != nil {
		return err
	}
	c.db.SetMaxOpenConns(8)
	c.db.SetMaxIdleConns(8)
	var syncMode int
	if err := c.db.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncMode); err != nil {
		return err
	}
	if syncMode != 2 {
		return fmt.Errorf("dbos: system database synchronous=%d, want 2 (FULL)", syncMode)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c.d, err = kit.OpenDBOS(ctx, dbos.Config{
		AppName:        "runstate-bench",
		SQLiteSystemDB: c.db,
		Logger:         logger,
	}, fw)
	if err != nil {
		return err
	}
	// DBOS must not have changed the durability setting on any connection.
	if err := c.checkSynchronous(ctx); err != nil {
		return err
	}
	return nil
}

// checkSynchronous checks synchronous=FULL on every connection the pool has.
func (c *dbosTransact) checkSynchronous(ctx context.Context) error {
	var conns []*sql.Conn
	defer func() {
		for _, conn := range conns {
			conn.Close()
		}
	}()
	for range 8 {
		conn, err := c.db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, conn)
		var syncMode int
		if err := conn.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&syncMode); err != nil {
			return err
		}
		if syncMode != 2 {
			return fmt.Errorf("dbos: a system database connection has synchronous=%d, want 2 (FULL)", syncMode)
		}
	}
	return nil
}

func (c *dbosTransact) Checkpoints(_ context.Context, first, n int, lat []time.Duration) error {
	return c.d.Checkpoints(first, n, lat)
}

func (c *dbosTransact) Close() error {
	var err error
	if c.d != nil {
		err = c.d.Close()
	}
	if cerr := c.db.Close(); err == nil {
		err = cerr
	}
	return err
}
