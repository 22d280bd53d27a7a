//go:build !linux

package runstate

// idOf returns the identity of f, an open file.
func idOf(f file) (fileID, error) { return statFileID(f) }

// pathIs reports whether path (a link is not followed) is the file id
// names.
func pathIs(path string, id fileID) (bool, error) { return lstatIs(path, id) }
