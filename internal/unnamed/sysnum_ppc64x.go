//go:build linux && (ppc64 || ppc64le)

package unnamed

// sysRenameat2 is renameat2's system call number, which the syscall
// package does not define for every architecture.
const sysRenameat2 = 357
