// Package unnamed writes a new file the way runstate's Stage.WriteFile
// does on Linux: an unnamed file (O_TMPFILE) made in the file's
// directory, written, then linked in under its name. A reader sees the
// whole file or none; a process killed before the link leaves nothing
// behind (the kernel frees the unnamed file); and it is one directory
// change, where a temp file renamed into place is two or three (and a
// rename between directories, which the kernel serializes file-system
// wide). internal/floorio's baselines write their outputs with it too,
// so that the floors do the same work as a checkpoint.
//
// It is for Linux only; elsewhere the package is empty.
package unnamed
