//go:build linux && (arm64 || loong64 || mips64 || mips64le || riscv64 || s390x)

package unnamed

import "syscall"

// sysRenameat2 is renameat2's system call number.
const sysRenameat2 = syscall.SYS_RENAMEAT2
