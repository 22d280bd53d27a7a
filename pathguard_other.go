//go:build !unix

package runstate

import "io/fs"

// oNonblock: opening a file does not block here (openRegular).
const oNonblock = 0

// oNoFollow: no such flag here.
const oNoFollow = 0

// linkCount is 1: tighten changes no mode on this system (the run's
// files have no group and other bits to lose).
func linkCount(fs.FileInfo) uint64 { return 1 }

// fileKeyOf: not used here (see linkCount).
func fileKeyOf(fs.FileInfo) (fileKey, bool) { return fileKey{}, false }
