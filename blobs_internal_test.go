package runstate

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A store without blobs (the file store) keeps no copy of what WriteFile
// wrote: Complete has no bytes to store.
func TestFileStoreKeepsNoOutputBytes(t *testing.T) {
	r, err := Open(t.TempDir(), &Options{Request: "kept"})
	require.NoError(t, err)
	defer r.Close()
	st, err := r.Begin(context.Background(), "a")
	require.NoError(t, err)
	require.NoError(t, st.WriteFile("out.txt", []byte("x")))
	assert.Nil(t, st.kept)
	assert.Zero(t, st.keptBytes)
	assert.Contains(t, st.outputs, "out.txt")
	require.NoError(t, st.Complete())
}
