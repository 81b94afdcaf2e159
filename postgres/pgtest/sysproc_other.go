//go:build unix && !linux

package pgtest

import "syscall"

// sysProcAttr runs a server program as cred (nil: as ourselves) in its own
// process group, so signals meant for the test do not reach it.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
