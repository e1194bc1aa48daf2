//go:build !linux

package pgtest

import "syscall"

// dieWithParent does nothing: only Linux kills a child when its parent dies.
func dieWithParent(*syscall.SysProcAttr) {}
