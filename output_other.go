//go:build !linux

package runstate

import (
	"io/fs"
	"os"
)

// outputDirs is the Linux fast path of Stage.WriteFile (output_linux.go);
// elsewhere outputs go through os.Root.
type outputDirs struct{}

func (*outputDirs) open(*os.Root)                                  {}
func (*outputDirs) close()                                         {}
func (*outputDirs) write(string, string, []byte, fs.FileMode) bool { return false }
