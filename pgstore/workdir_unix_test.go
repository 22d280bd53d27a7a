//go:build unix

package pgstore

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/runstate/runstate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A FIFO (or a directory) where the working directory's logs/run.json
// goes is refused at once, naming it, instead of Open waiting for ever
// for a writer to the FIFO.
func TestOpenRefusesARunJSONThatIsNoRegularFile(t *testing.T) {
	db := newTestDB(t)
	for _, tc := range []struct {
		kind string
		make func(path string) error
	}{
		{"a named pipe (FIFO)", func(path string) error { return syscall.Mkfifo(path, 0o644) }},
		{"a directory", func(path string) error { return os.Mkdir(path, 0o755) }},
	} {
		dir := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "logs"), 0o755))
		path := filepath.Join(dir, "logs", "run.json")
		require.NoError(t, tc.make(path))
		done := make(chan error, 1)
		go func() {
			r, err := db.Open(context.Background(), "fifo", dir, &runstate.Options{Request: "a run"})
			if r != nil {
				_ = r.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			require.Error(t, err, tc.kind)
			assert.Contains(t, err.Error(), path+" is "+tc.kind+", not a regular file")
			assert.Contains(t, err.Error(), "remove it")
		case <-time.After(20 * time.Second):
			t.Fatalf("Open waited on %s at logs/run.json", tc.kind)
		}
	}
}

// CheckWorkDir, without a server, refuses a logs or logs/tmp that is a
// symbolic link, and a logs/run.json that is a FIFO or a directory, as
// DB.Open does, naming each.
func TestCheckWorkDirRefusesLinksAndNonFiles(t *testing.T) {
	for _, c := range []struct {
		rel, want string
		make      func(p string) error
	}{
		{"logs", "is a symbolic link", func(p string) error { return os.Symlink(t.TempDir(), p) }},
		{"logs/tmp", "is a symbolic link", func(p string) error { return os.Symlink(t.TempDir(), p) }},
		{"logs/run.json", "", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"logs/run.json", "", func(p string) error { return os.Mkdir(p, 0o755) }},
	} {
		dir := t.TempDir()
		p := filepath.Join(dir, filepath.FromSlash(c.rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, c.make(p))
		done := make(chan error, 1)
		go func() { done <- CheckWorkDir(dir, "", "r") }()
		select {
		case err := <-done:
			require.ErrorIs(t, err, runstate.ErrInvalid, c.rel)
			assert.Contains(t, err.Error(), p, c.rel)
			assert.Contains(t, err.Error(), c.want, c.rel)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: CheckWorkDir hangs", c.rel)
		}
	}
}
