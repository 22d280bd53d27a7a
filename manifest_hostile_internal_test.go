package runstate

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A manifest.json whose checksum holds but whose stage has an attempt
// count no record holds, or an output of negative size, is not a usable
// snapshot: Open replays the ledger instead. It was taken as it was.
func TestManifestOutOfRangeIsNoSnapshot(t *testing.T) {
	for name, edit := range map[string]func(*StageStatus){
		"attempt -1":    func(st *StageStatus) { st.Attempt = -1 },
		"attempt 2^31":  func(st *StageStatus) { st.Attempt = 1 << 31 },
		"size negative": func(st *StageStatus) { st.Outputs[0].Size = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			s := newState()
			s.apply(&Record{Seq: 1, Ev: evPlan, Data: []byte(`["a"]`)})
			s.apply(&Record{Seq: 2, Ev: evBegin, Stage: "a", Attempt: 1})
			s.apply(&Record{Seq: 3, Ev: evComplete, Stage: "a", Attempt: 1, Outputs: []Output{{Path: "artifacts/a", SHA256: "ab", Size: 1}}})
			s.pos = chain{seq: 3, hash: strings.Repeat("0", 64), offset: 1000}
			s.lastLen = 100
			edit(s.stages["a"])
			out, err := s.encodeManifest(time.Unix(0, 0))
			require.NoError(t, err)
			_, _, err = decodeManifest(out)
			assert.Error(t, err)
		})
	}
}
