package main

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/herdcache/herd/redisstore/redisproc"
)

// requireTool ends the test for want of a program: it fails under CI=true,
// where a skipped test would pass unseen, and is skipped elsewhere.
func requireTool(t *testing.T, name, pkg string, err error) {
	t.Helper()
	msg := fmt.Sprintf("%s not found (%v); this test starts a real server: install it, e.g. apt-get install %s", name, err, pkg)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// startRedis starts a redis-server on a free loopback port, with
// persistence off, and returns its address; it is stopped when the test
// ends.
func startRedis(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath(redisproc.Binary); err != nil {
		requireTool(t, redisproc.Binary, "redis-server", err)
	}
	srv, err := redisproc.Start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	return srv.Addr()
}
