package runstate

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"os"
	"path/filepath"
)

// sourceDir is Options.SourceDir made absolute ("" if the working
// directory cannot be found: then File paths are used, and recorded, as
// given, the way they were before SourceDir).
func sourceDir(dir string) string {
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return ""
		}
		return wd
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	return abs
}

// sourcePath returns the name a File input is recorded under and the path
// to read it from: relative to the source directory, cleaned and with
// forward slashes, when p is inside it; absolute (cleaned, forward
// slashes) when it is not.
func (r *Run) sourcePath(p string) (name, path string) {
	if r.src == "" {
		return p, p
	}
	path = filepath.Clean(p)
	if !filepath.IsAbs(path) {
		path = filepath.Join(r.src, path)
	}
	rel, err := filepath.Rel(r.src, path)
	if err != nil || !filepath.IsLocal(rel) {
		return filepath.ToSlash(path), path
	}
	return filepath.ToSlash(rel), path
}

// recorded returns the inputs a done stage recorded, with the File inputs
// that a ledger written before SourceDir named by the path as given
// ("./parser.go", an absolute path inside the source directory) renamed
// to what this Begin records them as ("parser.go"): a run resumed with
// the same paths keeps its evidence. The map is not modified.
func (ev *evidence) recorded(inputs map[string]string) map[string]string {
	var out map[string]string // a copy, once one is renamed
	for name, given := range ev.given {
		cur := inputs
		if out != nil {
			cur = out
		}
		if _, ok := cur[name]; ok {
			continue
		}
		fp, ok := cur[given]
		if !ok {
			continue
		}
		if out == nil {
			out = maps.Clone(inputs)
		}
		delete(out, given)
		out[name] = fp
	}
	if out == nil {
		return inputs
	}
	return out
}

// hashFile is the fingerprint of the File input at p.
func hashFile(p string) (string, error) {
	f, _, err := openRegularIn(osFS{}, p, os.O_RDONLY)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := copyFile(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
