package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runstate/runstate/bench/internal/kit"

	"github.com/runstate/runstate/internal/floorio"
)

// fsyncProbe (-probe) measures how long one write + fdatasync of a
// checkpoint-sized record takes while other goroutines create and rename
// small files beside it, as the other goroutines of the concurrent mode
// do. On a machine with few cores the fsync needs CPU that the file
// creation takes, which caps what any group commit can gain there. First
// it compares an append + fdatasync with an overwrite of preallocated space
// + fdatasync, which needs no metadata written.
func fsyncProbe(base string, n int) error {
	dir, err := os.MkdirTemp(base, "fsyncprobe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	f, err := os.OpenFile(filepath.Join(dir, "ledger"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	line := make([]byte, 550)
	for i := range line {
		line[i] = 'x'
	}
	line[len(line)-1] = '\n'
	fmt.Printf("fsyncprobe: %d write+fdatasync of %d bytes per row, in %s\n", n, len(line), dir)

	// An append changes the file's size, which fdatasync must make durable
	// too (the inode); an overwrite of space already allocated and synced
	// (what SQLite does with its reused WAL) does not.
	pre, err := os.OpenFile(filepath.Join(dir, "preallocated"), os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer pre.Close()
	if _, err := pre.Write(make([]byte, n*len(line))); err != nil {
		return err
	}
	if err := pre.Sync(); err != nil {
		return err
	}
	var appends, overwrites []time.Duration
	for i := range 2 * n {
		t := time.Now()
		if i%2 == 0 {
			if _, err := f.Write(line); err != nil {
				return err
			}
			if err := floorio.Fdatasync(f); err != nil {
				return err
			}
			appends = append(appends, time.Since(t))
		} else {
			if _, err := pre.WriteAt(line, int64(i/2*len(line))); err != nil {
				return err
			}
			if err := floorio.Fdatasync(pre); err != nil {
				return err
			}
			overwrites = append(overwrites, time.Since(t))
		}
	}
	slices.Sort(appends)
	slices.Sort(overwrites)
	fmt.Printf("  append + fdatasync median %4.0f µs; overwrite of preallocated space + fdatasync median %4.0f µs\n",
		kit.US(appends[n/2]), kit.US(overwrites[n/2]))

	for _, creators := range []int{0, 1, 3, 7, 0, 7} {
		var stop atomic.Bool
		var wg sync.WaitGroup
		var created atomic.Int64
		for g := range creators {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !stop.Load(); i++ {
					p := filepath.Join(dir, fmt.Sprintf("g%d-%d", g, i))
					if os.WriteFile(p, line[:60], 0o644) == nil && os.Rename(p, p+".out") == nil {
						created.Add(1)
					}
				}
			}()
		}
		d := make([]time.Duration, 0, n)
		start := time.Now()
		for range n {
			t := time.Now()
			if _, err := f.Write(line); err != nil {
				return err
			}
			if err := floorio.Fdatasync(f); err != nil {
				return err
			}
			d = append(d, time.Since(t))
		}
		elapsed := time.Since(start)
		stop.Store(true)
		wg.Wait()
		slices.Sort(d)
		fmt.Printf("  %d goroutines creating files: write+fdatasync median %4.0f µs, p90 %4.0f µs; %6.0f files created/s\n",
			creators, kit.US(d[len(d)/2]), kit.US(d[len(d)*9/10]), float64(created.Load())/elapsed.Seconds())
	}
	return nil
}
