package runstate

import (
	"errors"
	"runtime"
	"syscall"
)

// diskFullReason marks a fail record whose error is a full disk or quota
// (diskFull): the failure does not count toward Options.MaxAttempts, since
// the stage can run again as it is once there is space.
const diskFullReason = "disk full: not counted toward MaxAttempts; free space, then run the stage again"

// diskFull reports whether err says that the disk or the user's quota is
// full: ENOSPC or EDQUOT, or on Windows ERROR_DISK_FULL and
// ERROR_HANDLE_DISK_FULL. That is not a stage's fault.
func diskFull(err error) bool {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	var errno syscall.Errno
	return runtime.GOOS == "windows" && errors.As(err, &errno) &&
		(errno == 112 || errno == 39) // ERROR_DISK_FULL, ERROR_HANDLE_DISK_FULL
}
