package runstatetest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/internal/faultfs"
	"github.com/runstate/runstate/internal/testhook"
	"github.com/runstate/runstate/runstatetest"
)

// powerLoss crashes the suite pipeline at every crossing of every crash
// point on a file system that then loses power: every write and directory
// entry not synced is dropped (or, every other time, a random part of the
// unsynced bytes stays: a prefix of a file's growth, as a torn write, or,
// one time in three of those, sector by sector kept, lost, zeroed or
// garbled, faultfs.PowerLossSectors). Every acknowledged record must
// survive, Open must be clean (under the sector model it may refuse
// damage that no durable copy covers, which Repair's cut then removes
// without an acknowledged record), and the run must resume to the same
// artifacts with each effect filed once.
func (s *suite) powerLoss(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, uint64(time.Now().UnixNano())))
	// Count the crossings in process (a child also counts its Open's and
	// Close's appends).
	run, err := runstate.Open(t.TempDir(), suiteOptions())
	require.NoError(t, err)
	var traps []*runstatetest.Trap
	for _, p := range runstatetest.Points {
		traps = append(traps, runstatetest.Watch(run, p, ""))
	}
	require.NoError(t, suitePipeline(newSender(s.rv.srv.URL), acker{}, 0)(context.Background(), run))
	var ats []runstatetest.At
	for i, p := range runstatetest.Points {
		traps[i].Disarm()
		for k := 0; k < traps[i].Crossings(); k++ {
			ats = append(ats, runstatetest.At{Point: p, Skip: k})
		}
	}
	require.NoError(t, run.Close())
	for i, at := range ats {
		var torn *rand.Rand
		sector := 0
		if i%2 == 1 {
			torn = rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			sector = []int{0, 512, 4096}[i/2%3]
		}
		s.powerLossTrial(t, at, torn, sector)
	}
}

func (s *suite) powerLossTrial(t *testing.T, at runstatetest.At, torn *rand.Rand, sector int) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "run")
	acks := acksOf(dir)
	ffs := faultfs.New()
	opts := suiteOptions()
	testhook.SetFS(opts, ffs)
	run, err := runstate.Open(dir, opts)
	require.NoError(t, err)
	trap := runstatetest.CrashAt(run, at)
	err = suitePipeline(newSender(s.rv.srv.URL), acker{acks}, 0)(ctx, run)
	trap.Disarm()
	require.True(t, trap.Fired(), "crossed %s", at)
	require.ErrorIs(t, err, runstatetest.ErrCrashed)
	if sector > 0 {
		require.NoError(t, ffs.PowerLossSectors(torn, sector))
	} else {
		require.NoError(t, ffs.PowerLoss(torn))
	}

	run, err = runstate.Open(dir, suiteOptions())
	var ce *runstate.CorruptError
	refused := sector > 0 && errors.As(err, &ce)
	if refused {
		// Damage no durable copy covers: cut it (lostAcks below
		// checks that no acknowledged record was at or after it).
		cut := ce.Line
		if strings.Contains(ce.Err.Error(), "prev hash does not match") {
			cut-- // the line before may be the damaged one
		}
		_, rerr := runstate.Repair(dir, &runstate.RepairOptions{TruncateAt: max(2, cut), Force: true})
		require.NoError(t, rerr, "repair after %v", err)
		run, err = runstate.Open(dir, suiteOptions())
	}
	require.NoError(t, err, "Open after a power loss at %s", at)
	acked, lost := lostAcks(t, dir, acks)
	assert.Empty(t, lost, "acknowledged records lost in a power loss at %s", at)
	require.NoError(t, suitePipeline(newSender(s.rv.srv.URL), acker{acks}, 0)(ctx, run))
	require.NoError(t, run.Close())
	f := runstatetest.CheckResumed(t, dir, s.ref)
	filed, resends := s.rv.deliveries(runID(t, dir))
	assert.Equal(t, 2, filed)
	assert.Zero(t, resends)
	s.fig.add(func(g *figures) {
		g.powerLoss++
		if sector > 0 {
			g.powerLossSectors++
		}
		if refused {
			g.powerLossRefused++
		}
		g.powerLossAcked += acked
		g.powerLossLost += len(lost)
		if f.OK() && len(lost) == 0 && filed == 2 && resends == 0 && !refused {
			g.powerLossOK++
		}
	})
}

// corruption damages copies of a finished run: every line in two ways (a
// flipped byte, a value edited into other valid JSON), every line but the
// last in four more (deleted, repeated, swapped with the next, a line
// inserted before it),
// plus an altered artifact and an edited manifest. Verify must report each
// at the right place, a replaying Open must refuse each damaged ledger and
// write nothing, and an edited manifest must be ignored. Torn tails (the
// last line cut at every tenth byte) must be cut aside by the next Open,
// with every complete record kept.
func (s *suite) corruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, uint64(time.Now().UnixNano())))
	base := t.TempDir()
	require.NoError(t, os.CopyFS(base, os.DirFS(s.ref)))
	lp := filepath.Join(base, "logs", "ledger.jsonl")
	data, err := os.ReadFile(lp)
	require.NoError(t, err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	lines = lines[:len(lines)-1] // the empty string after the last '\n'
	join := func(ls ...[][]byte) []byte {
		var b []byte
		for _, l := range ls {
			b = append(b, bytes.Join(l, nil)...)
		}
		return b
	}
	type damage struct {
		what string
		line int // the first line that must be reported (1-based)
		data []byte
	}
	var cases []damage
	for i := 0; i < len(lines); i++ {
		l := bytes.Clone(lines[i])
		pos := rng.IntN(len(l) - 1) // not the '\n': without it, the last line is a torn tail
		l[pos] ^= byte(1 + rng.IntN(255))
		// The flipped line is reported when it is no record any more,
		// or its checksum does not match (or its own prev hash was
		// hit), the next one when its prev hash no longer matches:
		// either way, -1 below. The last line too: its checksum.
		flipLine := -(i + 1)
		edited := editValue(lines[i])
		cases = append(cases,
			damage{"byte flipped", flipLine, join(lines[:i], [][]byte{l}, lines[i+1:])},
			damage{"value edited", i + 1, join(lines[:i], [][]byte{edited}, lines[i+1:])}, // its checksum
		)
		if i == len(lines)-1 {
			break // deleting, repeating or moving the last line is not damage a line can show
		}
		cases = append(cases,
			damage{"line deleted", i + 1, join(lines[:i], lines[i+1:])},
			damage{"line repeated", i + 2, join(lines[:i+1], lines[i:])},
			damage{"lines swapped", i + 1, join(lines[:i], [][]byte{lines[i+1], lines[i]}, lines[i+2:])},
			damage{"line inserted", i + 1, join(lines[:i], [][]byte{[]byte(`{"seq":` + fmt.Sprint(i+1) + `,"ev":"note","prev":""}` + "\n")}, lines[i:])},
		)
	}
	for _, c := range cases {
		dir := t.TempDir()
		require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
		p := filepath.Join(dir, "logs", "ledger.jsonl")
		require.NoError(t, os.WriteFile(p, c.data, 0o644))
		ok := true
		rep, err := runstate.Verify(dir)
		require.NoError(t, err)
		at := func(line int) bool { return line == c.line || c.line < 0 && (line == -c.line || line == -c.line+1) }
		if rep.OK() || rep.Problems[0].File != p || !at(rep.Problems[0].Line) {
			ok = false
			t.Errorf("%s at line %d: Verify reports %v", c.what, c.line, rep.Problems)
		}
		// Damage in bytes that logs/ledger.wal holds whole (the last
		// batches made durable through its ring) is what a power loss
		// may leave of the ledger's unsynced part: Verify says the
		// journal holds them, and Open writes them back, the ledger
		// the original again. Not when the edit moved a record the
		// journal does not hold (a line deleted, repeated or inserted
		// before the close record that the ledger's own fdatasync made
		// durable): no power loss moves records, and the write-back
		// would overwrite it. Other damage Open refuses, at a line
		// Verify reported, and writes nothing.
		journal := strings.Contains(rep.Problems[0].What, "whole in logs/ledger.wal")
		reported := func(line int) bool {
			for _, pr := range rep.Problems {
				if pr.File == p && pr.Line == line {
					return true
				}
			}
			return false
		}
		require.NoError(t, os.Remove(filepath.Join(dir, "manifest.json"))) // Open replays it all
		run, err := runstate.Open(dir, suiteOptions())
		after, _ := os.ReadFile(p)
		var ce *runstate.CorruptError
		switch {
		case err == nil && journal:
			require.NoError(t, run.Close())
			if !bytes.HasPrefix(after, data) {
				ok = false
				t.Errorf("%s at line %d: Open restored from the journal, but the ledger is not the original", c.what, c.line)
			}
		case err == nil:
			require.NoError(t, run.Close())
			ok = false
			t.Errorf("%s at line %d: Open accepted a corrupt ledger", c.what, c.line)
		case !errors.As(err, &ce) || ce.Path != p || !(at(ce.Line) || journal) || !reported(ce.Line):
			ok = false
			t.Errorf("%s at line %d: Open returns %v", c.what, c.line, err)
		case !bytes.Equal(after, c.data):
			ok = false
			t.Errorf("%s at line %d: Open wrote to a corrupt ledger", c.what, c.line)
		}
		s.fig.add(func(g *figures) {
			g.corrupted++
			if ok {
				g.detected++
				if err == nil {
					g.restored++
				}
				if errors.As(err, &ce) && strings.Contains(ce.Err.Error(), "records moved") {
					g.moved++
				}
			}
		})
	}

	// An artifact altered after its stage completed.
	for _, a := range []string{"artifacts/raw.txt", "artifacts/report.md"} {
		dir := t.TempDir()
		require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
		require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.FromSlash(a)), []byte("tampered\n"), 0o644))
		rep, err := runstate.Verify(dir)
		require.NoError(t, err)
		ok := !rep.OK() && rep.Problems[0].File == filepath.Join(dir, filepath.FromSlash(a))
		assert.True(t, ok, "altered %s: Verify reports %v", a, rep.Problems)
		s.fig.add(func(g *figures) {
			g.corrupted++
			if ok {
				g.detected++
			}
		})
	}

	// A manifest edited by hand: reported, and not trusted.
	{
		dir := t.TempDir()
		require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
		mp := filepath.Join(dir, "manifest.json")
		m, err := os.ReadFile(mp)
		require.NoError(t, err)
		edited := bytes.Replace(m, []byte(`"state": "complete"`), []byte(`"state": "pending"`), 1)
		require.NotEqual(t, m, edited)
		require.NoError(t, os.WriteFile(mp, edited, 0o644))
		rep, err := runstate.Verify(dir)
		require.NoError(t, err)
		st, err := runstate.Inspect(dir)
		require.NoError(t, err)
		ok := !rep.OK() && rep.Problems[0].File == mp && st.Done == len(suiteStages())
		assert.True(t, ok, "edited manifest: Verify reports %v; Inspect finds %d stages done", rep.Problems, st.Done)
		s.fig.add(func(g *figures) {
			g.corrupted++
			if ok {
				g.detected++
			}
		})
	}

	// Torn tails: the last record cut short, as by a writer that died
	// mid-append. (In the crash suite proper no record is acknowledged
	// before its line is whole; here the last line is a close record.)
	last := lines[len(lines)-1]
	good := join(lines[:len(lines)-1])
	for k := 1; k < len(last); k += 10 {
		dir := t.TempDir()
		require.NoError(t, os.CopyFS(dir, os.DirFS(base)))
		p := filepath.Join(dir, "logs", "ledger.jsonl")
		require.NoError(t, os.WriteFile(p, append(bytes.Clone(good), last[:k]...), 0o644))
		rep, err := runstate.Verify(dir)
		require.NoError(t, err)
		run, err := runstate.Open(dir, suiteOptions())
		ok := err == nil && !rep.OK() && strings.Contains(rep.Problems[0].What, "torn")
		if err == nil {
			require.NoError(t, run.Close())
			after, _ := os.ReadFile(p)
			ok = ok && bytes.HasPrefix(after, good)
			torn, _ := filepath.Glob(p + ".torn-*")
			ok = ok && len(torn) == 1
		}
		assert.True(t, ok, "torn tail at byte %d of the last line: %v %v", k, err, rep.Problems)
		s.fig.add(func(g *figures) {
			g.tornInjected++
			if ok {
				g.tornCut++
			}
		})
	}
}

// editValue changes a value in a ledger line and keeps it valid JSON: the
// session id's first hex digit, or the time's last digit.
func editValue(l []byte) []byte {
	out := bytes.Clone(l)
	for _, key := range []string{`"session":"`, `"at":"`} {
		if i := bytes.Index(out, []byte(key)); i >= 0 {
			j := i + len(key)
			if key == `"at":"` {
				j = i + len(key) + bytes.IndexByte(out[i+len(key):], '"') - 2
			}
			if out[j] == '0' {
				out[j] = '1'
			} else {
				out[j] = '0'
			}
			return out
		}
	}
	return bytes.Replace(out, []byte(`"seq"`), []byte(`"seq" `), 1)
}
