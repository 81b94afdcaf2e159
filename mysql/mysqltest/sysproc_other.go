//go:build unix && !linux

package mysqltest

import "syscall"

// sysProcAttr runs the server in its own process group, so signals meant
// for the test do not reach it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
