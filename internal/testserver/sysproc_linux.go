//go:build linux

package testserver

import "syscall"

// SysProcAttr runs a server program as cred (nil: as ourselves) in its own
// process group, so signals meant for the test do not reach it, and makes
// the kernel send it deathSig if the test process dies (strictly: if the
// OS thread that started it exits, which Go only does for goroutines that
// exit while locked to their thread).
func SysProcAttr(cred *syscall.Credential, deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: deathSig}
}
