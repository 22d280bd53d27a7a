//go:build !unix

package pgstore

// oNonblock: opening a file does not block here (checkWorkDir).
const oNonblock = 0
