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
	return DoCheckpointParts(ctx, r, first, n, lat, nil, nil, outputs)
}

// DoCheckpointParts is DoCheckpoints that also stores, where begin and
// complete are not nil, the two parts of checkpoint k's latency around its
// function: begin[k] from the call of Do to the start of the function (the
// begin record committed), complete[k] from the function's return to Do's
// (the complete record, and the output's bytes where the store keeps them,
// made durable). Two clock reads a checkpoint more.
func DoCheckpointParts(ctx context.Context, r *runstate.Run, first, n int, lat, begin, complete []time.Duration, outputs bool) error {
	for k := range n {
		id := first + k
		var t1, t2 time.Time
		t0 := time.Now()
		err := r.Do(ctx, StageName(id), func(ctx context.Context, st *runstate.Stage) error {
			t1 = time.Now()
			var err error
			if outputs {
				err = st.WriteFile(OutputPath(id), OutputData(id))
			}
			t2 = time.Now()
			return err
		})
		if err != nil {
			return err
		}
		end := time.Now()
		lat[k] = end.Sub(t0)
		if begin != nil {
			begin[k] = t1.Sub(t0)
		}
		if complete != nil {
			complete[k] = end.Sub(t2)
		}
	}
	return nil
}
