package s3test

import "syscall"

// sysProcAttr runs the gateway in its own process group, so a ^C meant for
// the test does not reach it first, and makes the kernel kill it if the
// test process dies (strictly: if the OS thread that started it exits).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
