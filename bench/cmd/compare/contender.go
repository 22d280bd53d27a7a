package main

import (
	"context"
	"sort"
	"time"
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
