package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestServerKillRestart(t *testing.T) {
	t.Parallel()
	n := Server(t)
	if !strings.HasPrefix(n.Addr, "127.0.0.1:") {
		t.Fatalf("Addr = %q, want a 127.0.0.1 address", n.Addr)
	}
	c := n.Client()
	if !c.Options().ContextTimeoutEnabled {
		t.Fatal("Client has ContextTimeoutEnabled off")
	}
	ctx := t.Context()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}

	n.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after Kill")
	}
	n.Kill() // killing a stopped server does nothing

	addr := n.Addr
	n.Restart()
	if n.Addr != addr {
		t.Fatalf("Restart moved the server from %s to %s", addr, n.Addr)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	if v, err := c.Get(ctx, "k").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET after Restart = %q, %v; want an empty server (no persistence)", v, err)
	}
	n.Restart() // a running server is killed first
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after a second Restart: %v", err)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	n := Server(t)
	c := n.Client()
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	n.Pause()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	err := c.Ping(ctx).Err()
	cancel()
	if err == nil {
		t.Fatal("PING answered while paused")
	}
	n.Resume()
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestCleanupKills(t *testing.T) {
	t.Parallel()
	var n *Node
	t.Run("server", func(t *testing.T) {
		n = Server(t)
	})
	// The subtest's cleanup has run: nothing listens on the port.
	if conn, err := net.Dial("tcp", n.Addr); err == nil {
		conn.Close()
		t.Fatalf("server on %s still accepts connections after its test ended", n.Addr)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	cn := Cluster(t)
	if len(cn.Nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(cn.Nodes))
	}
	ctx := t.Context()
	c := cn.Client()
	// Enough keys that every master gets some: the slots are split three ways.
	for i := range 64 {
		if err := c.Set(ctx, fmt.Sprint("key", i), i, 0).Err(); err != nil {
			t.Fatalf("SET through the cluster client: %v", err)
		}
	}
	for _, n := range cn.Nodes {
		if !strings.HasPrefix(n.Addr, "127.0.0.1:") {
			t.Fatalf("node Addr = %q, want a 127.0.0.1 address", n.Addr)
		}
		info, err := n.Client().ClusterInfo(ctx).Result()
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
			t.Fatalf("CLUSTER INFO on %s = %q, %v; want state ok with 3 nodes", n.Addr, info, err)
		}
		if size, err := n.Client().DBSize(ctx).Result(); err != nil || size == 0 {
			t.Errorf("node %s holds %d keys (%v), want some: it serves no slots", n.Addr, size, err)
		}
	}
}

// fakeTB records how a helper ended the test instead of ending it.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Skip(args ...any) {
	f.skipped, f.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatal(args ...any) {
	f.failed, f.msg = true, fmt.Sprint(args...)
	runtime.Goexit()
}

func TestMissingBinary(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, short := range []bool{false, true} {
		f := &fakeTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			requireBinary(f, "redis-server", "redis-server", short)
		}()
		<-done
		if f.skipped != short || f.failed == short {
			t.Errorf("short=%v: skipped %v, failed %v; want skipped only under -short", short, f.skipped, f.failed)
		}
		if !strings.Contains(f.msg, "apt-get install redis-server") {
			t.Errorf("short=%v: message %q has no install hint", short, f.msg)
		}
	}
}

// TestSentinelGroup proves the group fails over both ways a test needs: by
// SENTINEL FAILOVER, after which the old master replicates the new one, and
// by the master's death; the failover client follows each time.
func TestSentinelGroup(t *testing.T) {
	t.Parallel()
	g := Sentinel(t)
	first := g.Master()
	if first != g.Nodes[0] {
		t.Fatalf("master %s, want the node started as master, %s", first.Addr, g.Nodes[0].Addr)
	}
	c := g.Client()
	ctx := t.Context()
	if err := c.Set(ctx, "k", "1", 0).Err(); err != nil {
		t.Fatalf("SET through the failover client: %v", err)
	}
	if n, err := c.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 = %d, %v; want the replica's acknowledgement", n, err)
	}

	second := g.Failover()
	if second != g.Nodes[1] {
		t.Fatalf("after SENTINEL FAILOVER the master is %s, want the replica %s", second.Addr, g.Nodes[1].Addr)
	}
	if v, err := g.clients[second.Addr].Get(ctx, "k").Result(); err != nil || v != "1" {
		t.Fatalf("GET k on the new master = %q, %v; want the acknowledged write", v, err)
	}
	awaitWrite(t, g, c, second)
	g.await("the old master to replicate the new one", func(ctx context.Context) error {
		info, err := g.clients[first.Addr].Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "master_port:"+second.Addr[strings.LastIndexByte(second.Addr, ':')+1:]) || !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("old master: %v\n%s", err, info)
		}
		return nil
	})

	second.Kill()
	third := g.AwaitPromotion(second)
	if third != first {
		t.Fatalf("after the master's death the master is %s, want %s", third.Addr, first.Addr)
	}
	awaitWrite(t, g, c, third)
}

// awaitWrite waits until a write through c lands on master: the failover
// client learns of a new master through the Sentinels, and reconnects.
func awaitWrite(t *testing.T, g *SentinelGroup, c *redis.Client, master *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), sentinelTimeout)
	defer cancel()
	for {
		err := c.Set(ctx, "w", master.Addr, 0).Err()
		if err == nil {
			v, gerr := g.clients[master.Addr].Get(ctx, "w").Result()
			if gerr == nil && v == master.Addr {
				return
			}
			err = fmt.Errorf("GET w on %s = %q, %v", master.Addr, v, gerr)
		}
		if ctx.Err() != nil {
			t.Fatalf("no write through the failover client reached %s within %v: %v", master.Addr, sentinelTimeout, err)
		}
		time.Sleep(20 * pollEvery) // polls the client
	}
}
