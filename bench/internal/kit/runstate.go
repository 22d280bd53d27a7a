package kit

import (
	"context"
	"time"

	"github.com/runstate/runstate"
)

// DoCheckpoints records checkpoints first … first+n-1 on r, one Run.Do of
// a new stage each, whose function writes the output with Stage.WriteFile
// (unless !outputs), and stores the latency of checkpoint k in lat[k]: a
// begin record, the output, and the complete record, durable before Do
// returns. Safe for concurrent use with disjoint ids.
func DoCheckpoints(ctx context.Context, r *runstate.Run, first, n int, lat []time.Duration, outputs bool) error {
	for k := range n {
		id := first + k
		t0 := time.Now()
		err := r.Do(ctx, StageName(id), func(ctx context.Context, st *runstate.Stage) error {
			if !outputs {
				return nil
			}
			return st.WriteFile(OutputPath(id), OutputData(id))
		})
		if err != nil {
			return err
		}
		lat[k] = time.Since(t0)
	}
	return nil
}
