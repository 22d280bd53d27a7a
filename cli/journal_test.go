package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// journalOnlyRun returns a run whose ledger ends before acknowledged
// records that only logs/ledger.wal holds, as a machine crash (power
// loss) leaves it: the ledger's bytes were written but not yet
// fdatasync'd, the journal's were. It writes the run with the journal on
// (no NoSync): a session makes its first four batches durable through the
// ledger's fdatasync and the next two through the journal (the library
// measures both ways, store_file_wal.go's pick). It does stages until the
// newest batch is one the journal made durable, crashes the session
// there (runstatetest.Crash: no close record, no projection), and cuts
// the ledger back to just before the last record the newest header slot
// names. Every record after that one was in the ledger alone (a batch
// made durable by the ledger's own fdatasync), so a cut there could not
// be a power loss; the newest batch must be the journal's. want is the
// ledger's lines as the journal makes them: every acknowledged record,
// through that one.
func journalOnlyRun(t *testing.T) (dir string, want []string) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "run")
	r, err := runstate.Open(dir, &runstate.Options{Request: request})
	require.NoError(t, err)
	stages := make([]string, 40)
	for i := range stages {
		stages[i] = fmt.Sprintf("s%d", i)
	}
	require.NoError(t, r.Plan(context.Background(), stages...))
	slot := regexp.MustCompile(`^runstate-wal 1 end=(\d+) seq=(\d+) `)
	var end, seq int64
	for _, s := range stages {
		doStage(t, r, s)
		wal, err := os.ReadFile(filepath.Join(dir, "logs", "ledger.wal"))
		require.NoError(t, err)
		end, seq = 0, 0
		for _, s := range [][]byte{wal[:512], wal[512:1024]} {
			if m := slot.FindSubmatch(s); m != nil {
				if e, _ := strconv.ParseInt(string(m[1]), 10, 64); e > end {
					end = e
					seq, _ = strconv.ParseInt(string(m[2]), 10, 64)
				}
			}
		}
		if fi, err := os.Stat(ledgerPath(dir)); err == nil && seq > 0 && fi.Size() == end {
			break // the newest batch is the journal's
		}
		seq = 0
	}
	require.Positive(t, seq, "no stage's complete was made durable through logs/ledger.wal, the last of a batch")
	runstatetest.Crash(r)
	lines := ledgerLines(t, dir)
	require.Len(t, lines, int(seq), "the newest slot ends the ledger")
	require.NoError(t, os.WriteFile(ledgerPath(dir), []byte(strings.Join(lines[:seq-1], "")), 0o644))
	n := 0
	require.NoError(t, runstate.ReadLedger(dir, func(*runstate.Record) error { n++; return nil }))
	require.Equal(t, int(seq), n, "the library reads seq %d from the journal", seq)
	return dir, lines[:seq]
}

// Records that a machine crash left only in logs/ledger.wal are records:
// status, log and the library show them, so export prints them too, as
// the ledger lines they are (the journal holds those very bytes), and
// log -follow starts after them and goes on when the next session copies
// them back into the ledger.
func TestExportAndFollowReadTheJournal(t *testing.T) {
	dir, want := journalOnlyRun(t)
	n := len(want)

	res := readCLI(t, dir, "export", dir)
	require.Equal(t, 0, res.code, res.err)
	assert.Equal(t, strings.Join(want, ""), res.out, "every acknowledged record, the exact lines")

	res = readCLI(t, dir, "log", dir)
	require.Equal(t, 0, res.code, res.err)
	assert.Equal(t, n, strings.Count(res.out, "\n"))
	assert.Equal(t, int64(n), statusJSONOf(t, dir).Seq)

	f := follow(t, dir)
	for i := 1; i <= n; i++ {
		assert.Regexp(t, fmt.Sprintf(`^\s+%d  `, i), f.next(t))
	}
	// The next session copies them back, records that the crashed
	// session is gone, and opens.
	r, err := runstate.Open(dir, nil)
	require.NoError(t, err)
	l := f.next(t)
	if strings.Contains(l, "interrupted") {
		n++
		assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*interrupted .* is gone$`, n), l)
		l = f.next(t)
	}
	assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*open`, n+1), l)
	require.NoError(t, r.Close())
	assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*close`, n+2), f.next(t))
	assert.Empty(t, f.errb.String())
	assert.Equal(t, want, ledgerLines(t, dir)[:len(want)], "the journal's records are the lines exported")
}

// renameOver replaces dir's ledger by a new file holding data, renamed
// over it, as sed -i, an editor or a restore with mv does.
func renameOver(t *testing.T, dir, data string) {
	t.Helper()
	tmp := filepath.Join(dir, "logs", "ledger.jsonl.new")
	require.NoError(t, os.WriteFile(tmp, []byte(data), 0o644))
	require.NoError(t, os.Rename(tmp, ledgerPath(dir)))
}

// followHealthy starts log -follow on a new healthy run and reads the
// ledger's lines it shows first: lines are the ledger's, each with '\n'.
func followHealthy(t *testing.T) (dir string, lines []string, f *follower) {
	t.Helper()
	dir = healthyRun(t)
	lines = ledgerLines(t, dir)
	f = follow(t, dir)
	for range lines {
		f.next(t)
	}
	return dir, lines, f
}

// log -follow reads the ledger by its path: a file renamed over it is
// followed from the record after the last shown, by seq, when it holds
// the records shown; when it does not, log says what happened and exits 1
// (it kept reading the old file, which no writer appends to any more).
func TestLogFollowNoticesTheLedgerReplaced(t *testing.T) {
	t.Run("the same records", func(t *testing.T) {
		dir, lines, f := followHealthy(t)
		n := len(lines)
		renameOver(t, dir, strings.Join(lines, ""))
		time.Sleep(3 * pollEvery)
		r := openRun(t, dir)
		assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*open`, n+1), f.next(t))
		require.NoError(t, r.Close())
		assert.Regexp(t, fmt.Sprintf(`^\s+%d  .*close`, n+2), f.next(t))
		assert.Equal(t, fmt.Sprintf("runstate: %s was replaced by another file (one renamed over it: a backup restored, an edit with sed -i or an editor?); it holds the %d records shown: following it\n", ledgerPath(dir), n), f.errb.String())
	})
	t.Run("fewer records", func(t *testing.T) {
		dir, lines, f := followHealthy(t)
		n := len(lines)
		renameOver(t, dir, strings.Join(lines[:n-2], "")) // an older backup
		assert.Equal(t, exitFail, f.exit(t))
		assert.Contains(t, f.errb.String(), fmt.Sprintf("runstate: %s was replaced by another file (one renamed over it: a backup restored, an edit with sed -i or an editor?) that ends at seq %d, before seq %d already shown: its records are not shown; run 'runstate log %s' to read it, 'runstate verify %s' to check it", ledgerPath(dir), n-2, n, dir, dir))
	})
	t.Run("other records", func(t *testing.T) {
		dir, lines, f := followHealthy(t)
		n, other := len(lines), healthyRun(t)
		renameOver(t, dir, strings.Join(ledgerLines(t, other), "")) // another run's
		assert.Equal(t, exitFail, f.exit(t))
		assert.Contains(t, f.errb.String(), fmt.Sprintf("was replaced by another file (one renamed over it: a backup restored, an edit with sed -i or an editor?), whose seq %d is not the record shown as seq %d (the records differ there or before): its records are not shown", n, n))
	})
	t.Run("cut by repair", func(t *testing.T) { // in place: the same file, shorter
		dir, _, f := followHealthy(t)
		res := runCLI(t, "repair", "-truncate-at", "4", "-force", dir)
		require.Zero(t, res.code, res.err)
		assert.Equal(t, exitFail, f.exit(t))
		assert.Contains(t, f.errb.String(), fmt.Sprintf("runstate: %s shrank to %d bytes, below the ", ledgerPath(dir), fileSize(t, ledgerPath(dir))))
		assert.Contains(t, f.errb.String(), fmt.Sprintf("already shown: it was cut (runstate repair -truncate-at?); run 'runstate log %s' again", dir))
	})
	t.Run("removed", func(t *testing.T) {
		dir, lines, f := followHealthy(t)
		require.NoError(t, os.Rename(ledgerPath(dir), ledgerPath(dir)+".moved"))
		assert.Equal(t, exitFail, f.exit(t))
		assert.Contains(t, f.errb.String(), fmt.Sprintf("runstate: %s is gone (removed, or moved away) after seq %d was shown; run 'runstate log %s' again when the run has its ledger back", ledgerPath(dir), len(lines), dir))
	})
}
