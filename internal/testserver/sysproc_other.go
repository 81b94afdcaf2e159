//go:build unix && !linux

package testserver

import "syscall"

// SysProcAttr runs a server program as cred (nil: as ourselves) in its own
// process group, so signals meant for the test do not reach it. deathSig
// is Linux's only.
func SysProcAttr(cred *syscall.Credential, deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
}
