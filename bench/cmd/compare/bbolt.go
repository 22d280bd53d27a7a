package main

import (
	"context"
	"path/filepath"
	"time"

	"github.com/runstate/runstate/bench/internal/kit"

	bolt "go.etcd.io/bbolt"
)

var boltBucket = []byte("checkpoints")

// boltDB records each checkpoint as one Put in its own read-write
// transaction (DB.Update), which bbolt makes durable before Update returns
// (it fdatasyncs the data pages, then the meta page). With batch, it uses
// DB.Batch instead, which coalesces concurrent callers into one
// transaction (bbolt's group commit) at the price of waiting up to
// MaxBatchDelay (10 ms) for company.
type boltDB struct {
	fw    kit.FileWork
	db    *bolt.DB
	batch bool
}

func init() {
	register(contenderInfo{
		name:  "bbolt",
		order: 30,
		about: "go.etcd.io/bbolt, one DB.Update (Put) per checkpoint",
		make:  func() contender { return &boltDB{} },
	})
	register(contenderInfo{
		name:     "bbolt-batch",
		order:    31,
		about:    "go.etcd.io/bbolt, one DB.Batch (Put) per checkpoint: group commit, up to 10 ms wait",
		make:     func() contender { return &boltDB{batch: true} },
		optional: true,
	})
}

func (c *boltDB) Open(_ context.Context, dir string) error {
	fw, err := kit.NewFileWork(dir, writeOutputs)
	if err != nil {
		return err
	}
	c.fw = fw
	c.db, err = bolt.Open(filepath.Join(dir, "checkpoints.bolt"), 0o644, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	return c.db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	})
}

func (c *boltDB) Checkpoints(_ context.Context, first, n int, lat []time.Duration) error {
	for k := range n {
		id := first + k
		t0 := time.Now()
		data := kit.OutputData(id)
		if err := c.fw.Write(id, data); err != nil {
			return err
		}
		key, rec := []byte(kit.StageName(id)), kit.CheckpointRecord(id, data)
		put := func(tx *bolt.Tx) error { return tx.Bucket(boltBucket).Put(key, rec) }
		var err error
		if c.batch {
			err = c.db.Batch(put)
		} else {
			err = c.db.Update(put)
		}
		if err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}

func (c *boltDB) Close() error {
	c.fw.Close()
	return c.db.Close()
}
