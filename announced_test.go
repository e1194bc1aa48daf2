package herd_test

import (
	"github.com/herdcache/herd/remote"
)

// leaseOnly is what a herd Cache uses of memory.Remote's Lease, without
// its hold announcements (remote.HoldNotifier).
type leaseOnly interface {
	remote.Lease
	remote.WriteReleaser
	remote.Watcher
	remote.BatchWatcher
	remote.BatchLease
}

// quietLease is a Lease that announces no holds.
type quietLease struct{ leaseOnly }

// noHolds returns l, memory.Remote's Lease or a wrapper of it, without its
// hold announcements, for the tests of a replica that learns that a lease
// is held only by asking for it.
func noHolds(l remote.Lease) remote.Lease { return quietLease{l.(leaseOnly)} }
