package runstate

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate/internal/faultfs"
)

// A complete whose write or fsync failed was not acknowledged: OnRecord
// never hears of it.
func TestOnRecordSkipsRecordsThatDidNotLand(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule []faultfs.Rule
	}{
		{"write", []faultfs.Rule{{Op: faultfs.OpWrite, Path: "ledger.jsonl", Err: syscall.ENOSPC, Short: -1, Times: 1}}},
		{"fsync", []faultfs.Rule{
			{Op: faultfs.OpSync, Path: "ledger.wal", Err: syscall.EIO, Times: 1},
			{Op: faultfs.OpSync, Path: "ledger.jsonl", Err: syscall.EIO, Times: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ffs := faultfs.New()
			opts := faultOptions(ffs, nil)
			var evs []string
			opts.OnRecord = func(rec Record) { evs = append(evs, rec.Ev+" "+rec.Stage) }
			r, err := Open(t.TempDir(), opts)
			require.NoError(t, err)
			defer r.Close()
			st, err := r.Begin(t.Context(), "a")
			require.NoError(t, err)
			for _, rule := range tc.rule {
				ffs.Inject(rule)
			}
			require.Error(t, st.Complete())
			assert.Equal(t, []string{"create ", "open ", "begin a"}, evs)
		})
	}
}
