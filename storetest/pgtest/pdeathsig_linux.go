package pgtest

import "syscall"

// dieWithParent asks the kernel to kill a server when the test process that
// started it dies, so that no server outlives a crashed test.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
