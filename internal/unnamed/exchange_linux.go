package unnamed

import (
	"syscall"
	"unsafe"
)

// renameExchange is renameat2's RENAME_EXCHANGE flag.
const renameExchange = 1 << 1

// Exchange swaps the files that from (in fromDirFd) and to (in toDirFd)
// name, atomically (renameat2 with RENAME_EXCHANGE): a reader of either
// name sees one file or the other, never none. To replace a file, write
// the new one under a temp name, exchange, and remove the temp name,
// which then holds the old file. Unlike a rename over an existing file,
// this makes ext4 start no writeback of the new file's data (its
// auto_da_alloc does that for a rename that replaces a file: 0.2-0.5 ms
// on the development machine, four times the cost of the new file).
// It fails with ErrUnsupported where this kernel, architecture or file
// system cannot exchange (ENOSYS, EINVAL); rename instead there. Both
// names must exist (ENOENT otherwise).
func Exchange(fromDirFd int, from string, toDirFd int, to string) error {
	if sysRenameat2 == 0 {
		return ErrUnsupported
	}
	fromp, err := syscall.BytePtrFromString(from)
	if err != nil {
		return err
	}
	top, err := syscall.BytePtrFromString(to)
	if err != nil {
		return err
	}
	_, err = retry(func() (int, error) {
		_, _, e := syscall.Syscall6(sysRenameat2, uintptr(fromDirFd), uintptr(unsafe.Pointer(fromp)), uintptr(toDirFd), uintptr(unsafe.Pointer(top)), renameExchange, 0)
		if e != 0 {
			return 0, e
		}
		return 0, nil
	})
	switch err {
	case syscall.ENOSYS, syscall.EINVAL, syscall.EOPNOTSUPP:
		return ErrUnsupported
	}
	return err
}
