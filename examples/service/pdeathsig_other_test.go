//go:build !linux

package main

import "syscall"

// dieWithTest does nothing: only Linux kills a child when its parent dies
// (SysProcAttr.Pdeathsig); elsewhere the test's cleanup stops its servers.
func dieWithTest(*syscall.SysProcAttr) {}
