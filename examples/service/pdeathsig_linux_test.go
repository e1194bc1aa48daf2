package main

import "syscall"

// dieWithTest asks the kernel to kill a server the test starts when the
// test process dies, so that a test killed on its timeout leaves none
// behind.
func dieWithTest(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
