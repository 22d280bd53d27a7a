//go:build !linux

package runstate

// idOf returns the identity of f, an open file.
func idOf(f file) (fileID, error) { return statFileID(f) }

// pathIs reports whether rel, in the run directory (a link is not
// followed), is the file id names.
func (s *dirStore) pathIs(rel string, id fileID) (bool, error) { return lstatIs(s.path(rel), id) }
