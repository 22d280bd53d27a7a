//go:build linux && !(amd64 || 386 || arm || ppc64 || ppc64le || mips || mipsle || arm64 || loong64 || mips64 || mips64le || riscv64 || s390x)

package unnamed

// sysRenameat2 is 0 where runstate does not know renameat2's number:
// Exchange returns ErrUnsupported.
const sysRenameat2 = 0
