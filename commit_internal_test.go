package runstate

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A panic while deciding a record must not leave the group commit's
// leader flag set: every later append would wait for ever.
func TestCommitSurvivesPanickingDecision(t *testing.T) {
	r, err := Open(t.TempDir(), &Options{Request: "panic", NoSync: true})
	require.NoError(t, err)
	defer r.Close()

	_, err = r.commit(false, func(*state) ([]*Record, error) { panic("bug") })
	require.Error(t, err)
	assert.Contains(t, err.Error(), "internal error")

	done := make(chan error, 1)
	go func() { done <- r.Plan(context.Background(), "a") }()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("append after a panicking decision hangs")
	}
}
