package runstate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stage completed before SourceDir recorded its File inputs by the path
// as given. Resumed with the same paths, it keeps its evidence; a change
// is still seen.
func TestFileInputsRecordedAsGivenKeepTheirEvidence(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	abs := filepath.Join(src, "parser.go")
	require.NoError(t, os.WriteFile(abs, []byte("package parser\n"), 0o644))
	fp, err := hashFile(abs)
	require.NoError(t, err)
	r, err := Open(filepath.Join(t.TempDir(), "run"), &Options{Request: "legacy", NoSync: true, SourceDir: src})
	require.NoError(t, err)
	defer r.Close()
	for i, given := range []string{"./parser.go", abs} {
		stage := fmt.Sprintf("s%d", i+1)
		// What the code before SourceDir wrote: the path as given.
		_, err := r.commit(true, func(*state) ([]*Record, error) {
			in := map[string]string{given: fp}
			return []*Record{{Ev: evBegin, Stage: stage, Attempt: 1, Inputs: in}, {Ev: evComplete, Stage: stage, Attempt: 1, Inputs: in}}, nil
		})
		require.NoError(t, err)
		_, err = r.Begin(ctx, stage, File(given))
		assert.True(t, errors.Is(err, ErrDone), "%s: %v", given, err)
	}
	require.NoError(t, os.WriteFile(abs, []byte("package parser // changed\n"), 0o644))
	st, err := r.Begin(ctx, "s1", File("./parser.go"))
	require.NoError(t, err)
	assert.Equal(t, "input parser.go changed", st.Reason())
}
