package runstatetest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/runstate/runstate"
	"github.com/runstate/runstate/runstatetest"
)

// A pipeline that prints one line of 1 MiB (a JSON dump, say) before and
// after its work.
func longLinePipeline(ctx context.Context, dir string) error {
	long := strings.Repeat("x", 1<<20)
	fmt.Println(long)
	r, err := runstate.Open(dir, &runstate.Options{Request: "long line", NoSync: true})
	if err != nil {
		return err
	}
	defer r.Close()
	if err := r.Do(ctx, "a", func(context.Context, *runstate.Stage) error { return nil }); err != nil {
		return err
	}
	fmt.Println(long)
	return r.Close()
}

func init() {
	runstatetest.Register("long-line", longLinePipeline)
}

// TestChildWithALongOutputLine: a child whose pipeline prints a line
// longer than 64 KiB finishes, and Outcome.Output holds the line. Run read
// the output with a bufio.Scanner, which stops at such a line: the child
// then blocked writing to a pipe nobody read, and Run reported it timed
// out (or failed) after Child.Timeout.
func TestChildWithALongOutputLine(t *testing.T) {
	dir := t.TempDir()
	o := runstatetest.Child{Pipeline: "long-line", Dir: dir, Timeout: 30 * time.Second}.Run(runstatetest.Kill{})
	require.NoError(t, o.Err)
	assert.True(t, o.Finished)
	assert.Contains(t, o.Output, strings.Repeat("x", 1<<20)+"\n")
	assert.Equal(t, 2, strings.Count(o.Output, strings.Repeat("x", 1<<20)))
	res := runstatetest.RunKilled(t, runstatetest.Child{Pipeline: "long-line", Dir: t.TempDir(), Timeout: 30 * time.Second},
		runstatetest.Kill{At: runstatetest.At{Point: runstatetest.AfterBegin}})
	assert.Equal(t, 1, res.Kills)
	assert.Equal(t, 1, res.Finished)
}
