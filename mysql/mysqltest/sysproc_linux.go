package mysqltest

import "syscall"

// sysProcAttr runs the server in its own process group, so signals meant
// for the test do not reach it, and makes the kernel kill it if the test
// process dies (strictly: if the OS thread that started it exits, which Go
// only does for goroutines that exit while locked to their thread).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
