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

// A slow manifest rewrite (a run with many stages) stretches the interval
// so that rewriting the snapshot takes about 2% of the time at most.
func TestManifestIntervalStretchesWithCost(t *testing.T) {
	r, err := Open(t.TempDir(), &Options{Request: "interval", NoSync: true})
	require.NoError(t, err)
	defer r.Close()
	r.mu.Lock()
	r.manifestCost = time.Millisecond
	r.mu.Unlock()
	assert.Equal(t, time.Second, r.manifestInterval(), "a cheap rewrite: the configured interval")
	r.mu.Lock()
	r.manifestCost = 100 * time.Millisecond
	r.mu.Unlock()
	assert.Equal(t, 5*time.Second, r.manifestInterval())

	// The cost is measured by writeManifest itself.
	r.stMu.Lock()
	r.writeManifest()
	r.stMu.Unlock()
	r.mu.Lock()
	cost := r.manifestCost
	r.mu.Unlock()
	assert.Positive(t, cost)
	assert.Less(t, cost, 5*time.Second)
}
