//go:build !unix

package runstate

// oNonblock: opening a file does not block here (openRegular).
const oNonblock = 0
