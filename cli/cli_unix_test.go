//go:build unix

package cli

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// log -follow runs until interrupted, and then exits 0.
func TestLogFollowStopsOnInterrupt(t *testing.T) {
	dir := healthyRun(t)
	f := follow(t, dir)
	for range ledgerLines(t, dir) {
		f.next(t)
	}
	done := make(chan error, 1)
	go func() { done <- f.cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("log -follow ended by itself: %v", err)
	case <-time.After(3 * pollEvery):
	}
	require.NoError(t, f.cmd.Process.Signal(os.Interrupt))
	select {
	case err := <-done:
		assert.NoError(t, err, "exit 0 on SIGINT: %s", f.errb.String())
	case <-time.After(10 * time.Second):
		t.Fatal("log -follow did not stop within 10s of SIGINT")
	}
}
