package faultfs

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// The whole power-loss model: every sector of unsynced bytes meets each
// fate (kept, lost, zeroed, garbled) over many losses, the same seed
// gives the same loss, and no synced byte ever changes.
func TestShatterFates(t *testing.T) {
	synced := bytes.Repeat([]byte("s"), 700) // ends inside the second sector
	cur := append(bytes.Repeat([]byte("s"), 100), bytes.Repeat([]byte("o"), 100)...)
	cur = append(cur, synced[200:]...)
	cur = append(cur, bytes.Repeat([]byte("n"), 4000)...) // grown by 4000 bytes
	seen := map[string]int{}
	for seed := uint64(0); seed < 200; seed++ {
		for _, sector := range []int{512, 4096} {
			out := shatter(synced, cur, rand.New(rand.NewPCG(seed, 1)), sector)
			again := shatter(synced, cur, rand.New(rand.NewPCG(seed, 1)), sector)
			if !bytes.Equal(out, again) {
				t.Fatalf("seed %d: not reproducible", seed)
			}
			if len(out) < len(synced) {
				t.Fatalf("seed %d: %d bytes, shorter than the %d synced", seed, len(out), len(synced))
			}
			for i := range synced {
				if (i < 100 || i >= 200) && out[i] != synced[i] {
					t.Fatalf("seed %d sector %d: synced byte %d changed to %q", seed, sector, i, out[i])
				}
			}
			for i := len(synced); i < len(out); i++ {
				switch {
				case out[i] == 'n':
					seen["kept"]++
				case out[i] == 0:
					seen["zeroed"]++
				default:
					seen["garbled"]++
				}
			}
			if len(out) < len(cur) {
				seen["lost"]++
			}
			switch out[150] {
			case 's':
				seen["old"]++
			case 'o':
				seen["new"]++
			}
		}
	}
	for _, fate := range []string{"kept", "zeroed", "garbled", "lost", "old", "new"} {
		if seen[fate] == 0 {
			t.Errorf("no loss had a sector %s: %v", fate, seen)
		}
	}
}

// A hole with kept sectors after it: the case a ledger fdatasync'd only
// once a lap reads as mid-file damage.
func TestShatterLeavesHolesBeforeKeptSectors(t *testing.T) {
	cur := bytes.Repeat([]byte("n"), 8*512)
	for seed := uint64(0); seed < 100; seed++ {
		out := shatter(nil, cur, rand.New(rand.NewPCG(seed, 2)), 512)
		i := bytes.IndexByte(out, 0)
		if i >= 0 && bytes.LastIndexByte(out, 'n') > i {
			return
		}
	}
	t.Fatal("no loss in 100 left zeros with kept bytes after them")
}
