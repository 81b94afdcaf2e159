//go:build unix && !linux

package s3test

import "syscall"

// sysProcAttr runs the gateway in its own process group, so a ^C meant for
// the test does not reach it first.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
