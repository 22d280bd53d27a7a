package pgstore

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
)

// Sessions that close (and write their projections) while others append
// never deadlock: every transaction that locks the projections row takes
// the head row's lock in an order that cannot cycle (pgcli's 4-process
// bench hit "deadlock detected" here).
func TestClosingSessionsBesideAppendersDoNotDeadlock(t *testing.T) {
	db := newTestDB(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 4 {
		wg.Go(func() {
			for round := range 6 {
				r, err := db.Open(ctx, "r", t.TempDir(), &runstate.Options{Request: "deadlock", ManifestInterval: -1})
				if err != nil {
					errs <- err
					return
				}
				for i := range 3 {
					name := fmt.Sprintf("g%d-r%d-s%d", g, round, i)
					if err := r.Do(ctx, name, func(ctx context.Context, st *runstate.Stage) error {
						return st.WriteFile("out/"+name, []byte(name))
					}); err != nil {
						errs <- err
					}
				}
				if err := r.Close(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}
